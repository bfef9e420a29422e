package dev.kvferry.rdma;

/**
 * Moves bytes between a registered local region and a remote region known by its descriptor. One
 * class per backend ({@code local}, {@code cma}, {@code tcp}, later {@code cuda}); none knows the
 * others.
 *
 * <p>Calls never throw for what a peer or the caller can cause (bad offsets, dead peer, refused
 * token): they return a status that fails with a message naming the cause. Every offset and size
 * is checked against both regions before any byte moves.
 */
public interface Transport extends AutoCloseable {

  /** The backend's name as used in config and CLI flags: {@code local}, {@code cma}, {@code tcp}. */
  String name();

  /** Copies local bytes into the remote region, entry by entry. */
  TransferStatus write(MemoryRegion local, RegionDescriptor remote, TransferBatch batch);

  /** Copies remote bytes into the local region, entry by entry. */
  TransferStatus read(MemoryRegion local, RegionDescriptor remote, TransferBatch batch);

  /**
   * The descriptor a peer needs to reach {@code local} through this transport (process id, TCP
   * endpoint and token, ...). Hand it out only over the authenticated control plane.
   */
  RegionDescriptor describe(MemoryRegion local);

  /**
   * A new zeroed host region in {@code registry}, allocated where this transport's peers reach it
   * fastest: by default {@link RegionRegistry#allocateHost} (shared pages a cma peer maps); ucx has
   * UCX allocate it. Close it as any region.
   */
  default MemoryRegion allocateHost(RegionRegistry registry, long lengthBytes) {
    return registry.allocateHost(lengthBytes);
  }

  /**
   * The peer that described {@code peerRegion} has left (or restarted as a new incarnation):
   * release what is kept for it (idle connections, opened mappings, copy streams). Copies already
   * queued to it still complete first; a later transfer with it fails or reopens what it needs.
   */
  default void peerGone(RegionDescriptor peerRegion) {}

  /**
   * Whether this transport can store a peer's done word behind its writes ({@link
   * #openPeerDoneWords}). D offers P a word only then; both sides run the same transport kind.
   */
  default boolean storesDoneWords() {
    return false;
  }

  /**
   * Whether {@code write} and {@code read} of {@code batch} return without copying in the
   * caller's thread (the copy goes to the transport's own threads; no call blocks on the peer),
   * so a caller that must not block, an actor, may call them itself rather than hand the call to
   * an I/O pool first. False unless a transport knows.
   */
  default boolean startsWithoutBlocking(TransferBatch batch) {
    return false;
  }

  /**
   * Whether every done word this transport stores is followed by a ring of the file's bell
   * ({@link dev.kvferry.rdma.cuda.SharedDoneWords#store}), so D's watcher may sleep until rung
   * instead of polling. False where a GPU stream stores the word: no CPU is there to ring.
   */
  default boolean ringsDoneWordBell() {
    return false;
  }

  /**
   * P: the done words D named in its announcement (the file's bare name and its size in words),
   * ready for stores through this transport. Open once per file; close when that peer leaves.
   * The name comes off the network: a transport that maps the file checks it first.
   *
   * @throws IllegalArgumentException naming what is wrong with the name or the file
   * @throws UnsupportedOperationException where {@link #storesDoneWords} is false
   */
  default PeerDoneWords openPeerDoneWords(String name, int slots) {
    throw new UnsupportedOperationException("the " + name() + " transport stores no done words");
  }

  /**
   * D: its own done words, which a peer's in-band store may now target (tcp: the listener stores
   * a word only into a file accepted here and refuses any other name). Nothing to do where P maps
   * the file itself (cma, cuda).
   */
  default void acceptDoneWords(dev.kvferry.rdma.cuda.SharedDoneWords own) {}

  /** D: its done words are going away; in-band stores into them are refused from now on. */
  default void withdrawDoneWords(dev.kvferry.rdma.cuda.SharedDoneWords own) {}

  /** Stops listeners and closes connections; pending transfers fail. */
  @Override
  void close();
}
