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
   * The peer that described {@code peerRegion} has left (or restarted as a new incarnation):
   * release what is kept for it (idle connections, opened mappings, copy streams). Copies already
   * queued to it still complete first; a later transfer with it fails or reopens what it needs.
   */
  default void peerGone(RegionDescriptor peerRegion) {}

  /** Stops listeners and closes connections; pending transfers fail. */
  @Override
  void close();
}
