package dev.kvferry.rdma;

import dev.kvferry.rdma.cuda.Cuda;
import dev.kvferry.rdma.cuda.SharedDoneWords;
import java.io.IOException;
import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.net.StandardSocketOptions;
import java.net.UnknownHostException;
import java.nio.ByteBuffer;
import java.nio.channels.SocketChannel;
import java.util.IdentityHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.Objects;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicReference;
import java.util.concurrent.ConcurrentLinkedDeque;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;
import org.jspecify.annotations.Nullable;

/**
 * Moves bytes between hosts over TCP. Each instance can listen and serve the regions of its
 * {@link RegionRegistry}; as a client it connects to the endpoint in a peer's descriptor,
 * presents the peer's token before anything else, and reuses the connection for later batches.
 * Bytes go from the sender's region straight to the receiver's (gathering writes, scattering
 * reads into direct views of the registered memory); each frame is acknowledged so a status
 * fails with the receiver's own reason. Wire format: {@link TcpWire}.
 *
 * <p>GPU memory ({@link RegionKind#CUDA}) on either side is staged by the side that holds it
 * through pinned host buffers ({@link PinnedStaging}, sized by {@link
 * TransportOptions#withTcpStaging}); the wire does not change, so each side stages or not on its
 * own. Host regions take the direct path as before.
 *
 * <p>Batches run on {@link TransportOptions#ioThreads()} background threads; {@code write} and
 * {@code read} return at once.
 */
public final class TcpTransport implements Transport {
  private static final Logger log = LoggerFactory.getLogger(TcpTransport.class);

  /** Batches smaller than this go on one connection whatever {@link TransportOptions#tcpStreams}. */
  public static final long MIN_STRIPE_BYTES = 1L << 20;
  private static final int MAX_IDLE_PER_ENDPOINT = 8;
  /** Peer incarnations that may keep idle connections; the oldest seen go first beyond it. */
  static final int MAX_POOLED_PEERS = 64;

  private final RegionRegistry registry;
  private final TransportOptions options;
  private final IoWatchdog watchdog;
  private final @Nullable TcpListener listener;
  private final String advertisedHost;
  private final TransferExecutor executor;
  private final PinnedStaging staging;
  private final Map<PeerIncarnation, ConcurrentLinkedDeque<Connection>> idle =
      new ConcurrentHashMap<>();
  /** This process's done-word files that peers may store into through the listener, by name. */
  private final Map<String, SharedDoneWords> ownDoneWords = new ConcurrentHashMap<>();

  /**
   * One peer incarnation: its data endpoint and the token its registry issued (new at every
   * restart). The idle pool's key: records compare by value, the token's bytes by content.
   */
  private record PeerIncarnation(String host, int port, ByteBuffer token) {
    static PeerIncarnation of(RegionDescriptor remote) {
      return new PeerIncarnation(remote.tcpHost(), remote.tcpPort(), ByteBuffer.wrap(remote.token()));
    }

    String endpoint() {
      return host + ":" + port;
    }

    boolean sameEndpoint(PeerIncarnation other) {
      return port == other.port && host.equals(other.host);
    }

    // Written out: the record's generated ones go through method handles, slow before the JIT
    // compiled them (PeerKey in the actors module says more); this key is looked up per batch.
    @Override
    public int hashCode() {
      return (31 * host.hashCode() + port) * 31 + token.hashCode();
    }

    @Override
    public boolean equals(@Nullable Object o) {
      return o instanceof PeerIncarnation p && sameEndpoint(p) && token.equals(p.token);
    }
  }
  private final Set<Connection> open = ConcurrentHashMap.newKeySet();
  /** Peer incarnations that left: batches queued for them fail instead of connecting. */
  private final Set<PeerIncarnation> gone = ConcurrentHashMap.newKeySet();
  private volatile boolean closed;

  /**
   * Opens the transport and, when {@code options.tcpListen()}, its listener.
   *
   * @throws IOException when the listener cannot bind (port in use, unknown host)
   */
  public TcpTransport(RegionRegistry registry, TransportOptions options) throws IOException {
    this.registry = registry;
    this.options = options;
    this.watchdog = new IoWatchdog("tcp", options.ioTimeout().toNanos());
    // Touches no CUDA until a GPU region is moved.
    this.staging =
        new PinnedStaging(
            options.tcpStagingBuffers(), options.tcpStagingBufferBytes(),
            options.ioTimeout().toNanos());
    try {
      this.listener =
          options.tcpListen()
              ? new TcpListener(registry, options, watchdog, staging, ownDoneWords)
              : null;
    } catch (IOException e) {
      watchdog.close();
      throw e;
    }
    this.advertisedHost = listener == null ? "" : advertisedHost(options, listener.boundAddress());
    this.executor = new TransferExecutor("tcp", options.ioThreads());
  }

  private static String advertisedHost(TransportOptions options, InetSocketAddress bound) {
    if (!options.tcpAdvertisedHost().isEmpty()) {
      return options.tcpAdvertisedHost();
    }
    if (!bound.getAddress().isAnyLocalAddress()) {
      return bound.getAddress().getHostAddress();
    }
    try {
      String host = InetAddress.getLocalHost().getHostAddress();
      log.warn(
          "tcp listener bound to {} without an advertised host; advertising {} (set one with "
              + "TransportOptions.withTcpAdvertisedHost)", bound, host);
      return host;
    } catch (UnknownHostException e) {
      return "127.0.0.1";
    }
  }

  @Override
  public String name() {
    return "tcp";
  }

  /** The listener's port, or 0 when this transport does not listen. */
  public int port() {
    return listener == null ? 0 : listener.boundAddress().getPort();
  }

  /** Connections the listener serves now (0 without a listener). */
  int listenerConnections() {
    return listener == null ? 0 : listener.activeConnections();
  }

  /** Pinned staging lanes allocated and not yet freed (for tests). */
  int stagingLanes() {
    return staging.laneCount();
  }

  /**
   * @throws dev.kvferry.rdma.cuda.CudaUnavailableException for a GPU region on a host without
   *     CUDA (its bytes could not be served)
   */
  @Override
  public RegionDescriptor describe(MemoryRegion local) {
    if (listener == null) {
      throw new IllegalStateException("this tcp transport was opened without a listener");
    }
    if (local.registry() != registry) {
      throw new IllegalArgumentException(
          "region " + local.id() + " of " + local.owner() + " is not in the registry this tcp "
              + "listener serves (" + registry.owner() + ")");
    }
    if (local.kind() == RegionKind.CUDA) {
      Cuda.require();
    }
    return local.descriptor().withTcp(advertisedHost, port(), registry.token());
  }

  @Override
  public TransferStatus write(MemoryRegion local, RegionDescriptor remote, TransferBatch batch) {
    return start(local, remote, batch, true);
  }

  @Override
  public TransferStatus read(MemoryRegion local, RegionDescriptor remote, TransferBatch batch) {
    return start(local, remote, batch, false);
  }

  @Override
  public boolean storesDoneWords() {
    return true;
  }

  /** D's listener stores the word and rings the bell after it. */
  @Override
  public boolean ringsDoneWordBell() {
    return true;
  }

  /**
   * D's words as a name only: D may be on another host, so nothing is mapped here. The value goes
   * in band, a DONE_WORD frame behind the data, and D's listener stores it into D's own mapping.
   */
  @Override
  public PeerDoneWords openPeerDoneWords(String name, int slots) {
    SharedDoneWords.checkPeerName(name, slots);
    return new InBandDoneWords(name, slots);
  }

  @Override
  public void acceptDoneWords(SharedDoneWords own) {
    ownDoneWords.put(own.name(), own);
  }

  @Override
  public void withdrawDoneWords(SharedDoneWords own) {
    ownDoneWords.remove(own.name(), own);
  }

  @Override
  public void close() {
    closed = true;
    if (listener != null) {
      listener.close();
    }
    for (Connection c : open) {
      c.close();
    }
    idle.clear();
    executor.close();
    watchdog.close();
    staging.close();
  }

  private TransferStatus start(
      MemoryRegion local, RegionDescriptor remote, TransferBatch batch, boolean toRemote) {
    if (closed) {
      return TransferStatus.failed("tcp transport is closed");
    }
    if (local.kind() == RegionKind.CUDA && !Cuda.available()) {
      return TransferStatus.failed(
          "tcp: local region " + local.id() + " is GPU memory and CUDA not available: "
              + Cuda.unavailableReason() + "; nothing was moved");
    }
    if (remote.tcpHost().isEmpty() || remote.tcpPort() <= 0 || remote.token().length == 0
        || remote.token().length > TcpWire.MAX_TOKEN_BYTES) {
      return TransferStatus.failed(
          "region " + remote.regionId() + " of " + owner(remote) + " has no tcp endpoint and "
              + "token in its descriptor; describe it with the peer's tcp transport");
    }
    TransferStatus refused = batch.pinAndCheck("tcp", local, remote);
    if (refused != null) {
      return refused;
    }
    Exchange exchange = toRemote ? Exchange.WRITE : Exchange.READ;
    TransferBatch[] parts = batch.totalBytes() >= MIN_STRIPE_BYTES
        ? batch.split(options.tcpStreams()) : new TransferBatch[] {batch};
    TransferStatus status = TransferStatus.pending();
    if (parts.length == 1) {
      executor.submit(status,
          () -> run(remote, exchange, batch.totalBytes(), status,
              c -> c.transfer(local, remote, batch, toRemote)),
          local::unpin);
      return status;
    }
    // Striped: each part on its own connection, in parallel on the io threads; the batch ends
    // when every part has (the local region stays pinned until then).
    AtomicInteger left = new AtomicInteger(parts.length);
    AtomicReference<@Nullable String> failure = new AtomicReference<>();
    for (TransferBatch part : parts) {
      TransferStatus partStatus = TransferStatus.pending();
      executor.submit(partStatus,
          () -> run(remote, exchange, part.totalBytes(), partStatus,
              c -> c.transfer(local, remote, part, toRemote)),
          () -> {
            if (!partStatus.succeeded()) {
              failure.compareAndSet(null, partStatus.failureMessage());
            }
            if (left.decrementAndGet() == 0) {
              local.unpin();
              String why = failure.get();
              if (why == null) {
                status.succeed(batch.totalBytes());
              } else {
                status.fail(why + " (one of " + parts.length + " streams of this batch; the other"
                    + " streams' bytes may have landed)");
              }
            }
          });
    }
    return status;
  }


  /** What a connection is used for, as the failure messages name it. */
  private enum Exchange {
    WRITE("write to ", "write"),
    READ("read from ", "read"),
    DONE_WORD("done word to ", "done word");

    final String toPeer;
    final String noun;

    Exchange(String toPeer, String noun) {
      this.toPeer = toPeer;
      this.noun = noun;
    }
  }

  /** One exchange on a connection: null when the listener accepted it, else its reason. */
  private interface OnConnection {
    @Nullable String run(Connection c) throws IOException;
  }

  /**
   * Runs one exchange; a stale pooled connection gets one retry on a fresh one (writes, reads and
   * done words are idempotent).
   */
  private void run(
      RegionDescriptor remote, Exchange exchange, long bytes, TransferStatus status,
      OnConnection work) {
    PeerIncarnation key = PeerIncarnation.of(remote); // no string built per batch
    if (gone.contains(key)) {
      // Queued behind a batch to a peer since removed: connecting would wait out the I/O timeout.
      status.fail("tcp " + exchange.toPeer + key.endpoint() + " ("
          + owner(remote) + ") not started: that peer left the cluster");
      return;
    }
    for (int attempt = 0; ; attempt++) {
      Connection c = pool(key).pollFirst();
      boolean reused = c != null;
      try {
        if (c == null) {
          c = connect(remote, key);
        }
        String refusal = work.run(c);
        if (refusal != null) {
          c.close(); // the listener closes after an error ack
          status.fail(
              "tcp peer " + key.endpoint() + " (" + owner(remote) + ") refused the "
                  + exchange.noun + ": " + refusal);
          return;
        }
        release(key, c);
        status.succeed(bytes);
        return;
      } catch (IOException e) {
        boolean timedOut = c != null && c.progress.timedOut;
        if (c != null) {
          c.close();
        }
        boolean stagingFailed = e instanceof PinnedStaging.StagingException;
        if (reused && attempt == 0 && !timedOut && !closed && !stagingFailed
            && !(e instanceof TokenRefusedException)) {
          // The peer restarted or dropped idle connections: the other pooled ones are stale too.
          log.debug("tcp: pooled connection to {} failed ({}); retrying on a new one",
              key.endpoint(), e.toString());
          ConcurrentLinkedDeque<Connection> stale = idle.get(key);
          for (Connection old; stale != null && (old = stale.pollFirst()) != null; ) {
            old.close();
          }
          continue;
        }
        String why;
        if (closed) {
          why = "transport closed";
        } else if (timedOut) {
          why = "no progress for " + options.ioTimeout().toMillis() + " ms";
        } else if (e instanceof TokenRefusedException) {
          why = "the listener refused our token (" + e.getMessage() + "); the descriptor is stale "
              + "or not from this peer";
        } else {
          why = e.getMessage() == null ? e.getClass().getSimpleName() : e.getMessage();
        }
        status.fail(
            "tcp " + exchange.toPeer + key.endpoint() + " (" + owner(remote)
                + ") failed: " + why);
        return;
      }
    }
  }

  /**
   * The idle connections to one peer incarnation (endpoint and token). A new token at an endpoint
   * is a restarted peer: the old incarnation's connections are closed, not kept forever; and no
   * more than {@link #MAX_POOLED_PEERS} peers keep idle connections.
   */
  private ConcurrentLinkedDeque<Connection> pool(PeerIncarnation key) {
    ConcurrentLinkedDeque<Connection> pool = idle.get(key);
    if (pool != null) {
      return pool;
    }
    for (PeerIncarnation other : idle.keySet()) {
      if (other.sameEndpoint(key) || idle.size() >= MAX_POOLED_PEERS) {
        closeIdle(other);
      }
    }
    return idle.computeIfAbsent(key, k -> new ConcurrentLinkedDeque<>());
  }

  private void closeIdle(PeerIncarnation key) {
    ConcurrentLinkedDeque<Connection> gone = idle.remove(key);
    for (Connection old; gone != null && (old = gone.pollFirst()) != null; ) {
      old.close();
    }
  }

  @Override
  public void peerGone(RegionDescriptor peerRegion) {
    PeerIncarnation left = PeerIncarnation.of(peerRegion);
    if (gone.size() >= MAX_POOLED_PEERS) {
      gone.clear(); // a bound, not a history: a peer this old has no batches queued any more
    }
    gone.add(left);
    closeIdle(left);
    // Batches still moving to or from it would otherwise wait out the I/O timeout on a dead link
    // while their blocks stay lent: closing the socket fails them now, and nothing more is sent.
    for (Connection c : open) {
      if (c.peer.equals(left)) {
        c.close();
      }
    }
  }

  /** Peer incarnations with a pool of idle connections (tests). */
  int pooledPeers() {
    return idle.size();
  }

  /** Idle pooled connections over all peers (tests: a striped batch leaves one per stream). */
  int idleConnections() {
    int n = 0;
    for (ConcurrentLinkedDeque<Connection> pool : idle.values()) {
      n += pool.size();
    }
    return n;
  }

  private void release(PeerIncarnation key, Connection c) {
    ConcurrentLinkedDeque<Connection> pool = idle.get(key);
    if (closed || pool == null || pool.size() >= MAX_IDLE_PER_ENDPOINT) {
      c.close();
    } else {
      pool.offerFirst(c);
    }
  }

  private Connection connect(RegionDescriptor remote, PeerIncarnation peer) throws IOException {
    String endpoint = peer.endpoint();
    SocketChannel channel = SocketChannel.open();
    Connection c = new Connection(channel, peer);
    open.add(c);
    try {
      channel.setOption(StandardSocketOptions.TCP_NODELAY, true);
      channel.setOption(StandardSocketOptions.SO_KEEPALIVE, true);
      if (options.tcpSocketBufferBytes() > 0) {
        channel.setOption(StandardSocketOptions.SO_SNDBUF, options.tcpSocketBufferBytes());
        channel.setOption(StandardSocketOptions.SO_RCVBUF, options.tcpSocketBufferBytes());
      }
      c.progress.busy();
      watchdog.watch(channel, c.progress, "tcp connection to " + endpoint);
      channel.socket().connect(
          new InetSocketAddress(remote.tcpHost(), remote.tcpPort()),
          (int) Math.min(Integer.MAX_VALUE, options.ioTimeout().toMillis()));
      String refusal = c.hello(remote.token());
      if (refusal != null) {
        throw new TokenRefusedException(refusal);
      }
      c.progress.idle();
      return c;
    } catch (IOException | RuntimeException e) {
      c.close();
      throw e;
    }
  }

  /**
   * P's handle on D's words over tcp: a store waits for the transfer's writes (each acknowledged
   * by D's listener once its bytes landed), then sends a DONE_WORD frame on a pooled connection
   * to D, the one the last write returned (the pool hands out the most recently used first).
   */
  private final class InBandDoneWords implements PeerDoneWords {
    private final String name;
    private final byte[] nameBytes;
    private final int slots;

    InBandDoneWords(String name, int slots) {
      this.name = name;
      this.nameBytes = name.getBytes(java.nio.charset.StandardCharsets.US_ASCII);
      this.slots = slots;
    }

    @Override
    public TransferStatus storeAfter(
        List<TransferStatus> writes, MemoryRegion local, RegionDescriptor remote, int slot,
        long value) {
      if (slot < 0 || slot >= slots) {
        return TransferStatus.failed(
            "done word " + slot + " is outside " + name + " (" + slots + " words)");
      }
      return PeerDoneWords.storeWhenLanded(writes, stored -> executor.submit(stored,
          () -> run(remote, Exchange.DONE_WORD, Long.BYTES, stored,
              c -> c.doneWord(nameBytes, slot, value)),
          () -> {}));
    }

    @Override
    public void close() {
      // nothing is mapped on this side
    }
  }

  /** The listener answered our hello with an error. */
  private static final class TokenRefusedException extends IOException {
    private static final long serialVersionUID = 1L;

    TokenRefusedException(String reason) {
      super(reason);
    }
  }

  private static String owner(RegionDescriptor remote) {
    return remote.owner().isEmpty() ? "?" : remote.owner();
  }

  /** One client connection; used by one batch at a time (taken from and returned to the pool). */
  private final class Connection {
    final SocketChannel channel;
    final PeerIncarnation peer;
    final String endpoint;
    final TcpWire.Progress progress = new TcpWire.Progress();
    final ByteBuffer frame =
        ByteBuffer.allocateDirect(
            TcpWire.FRAME_HEADER_BYTES + TcpWire.MAX_ENTRIES * TcpWire.ENTRY_BYTES);
    final ByteBuffer ack =
        ByteBuffer.allocateDirect(TcpWire.ACK_HEADER_BYTES + TcpWire.MAX_MESSAGE_BYTES);
    final long[] localOffsets = new long[TcpWire.MAX_ENTRIES];
    final long[] remoteOffsets = new long[TcpWire.MAX_ENTRIES];
    final long[] lengths = new long[TcpWire.MAX_ENTRIES];
    final ByteBuffer[] iov = new ByteBuffer[RegionSlots.SLOTS];
    final Map<MemoryRegion, RegionSlots> slots = new IdentityHashMap<>();

    Connection(SocketChannel channel, PeerIncarnation peer) {
      this.channel = channel;
      this.peer = peer;
      this.endpoint = peer.endpoint();
    }

    /** Presents the token; returns null when accepted, else the listener's reason. */
    @Nullable String hello(byte[] token) throws IOException {
      frame.clear().putInt(TcpWire.MAGIC).put((byte) TcpWire.VERSION).put((byte) token.length)
          .put(token).flip();
      TcpWire.writeFully(channel, frame, progress);
      return TcpWire.readAck(channel, ack, progress);
    }

    /**
     * Sends one batch as frames of up to {@link TcpWire#MAX_ENTRIES} entries of at most {@link
     * TcpWire#MAX_ENTRY_BYTES} each. Returns null on success or the listener's reason.
     */
    @Nullable String transfer(MemoryRegion local, RegionDescriptor remote, TransferBatch batch, boolean toRemote)
        throws IOException {
      progress.busy();
      watchdog.watch(channel, progress, "tcp connection to " + endpoint);
      boolean onGpu = local.kind() == RegionKind.CUDA;
      RegionSlots localSlots = onGpu ? null : slotsFor(local);
      PinnedStaging.Lane lane = null;
      int framesSent = 0;
      int acksRead = 0;
      try {
        if (onGpu) {
          lane = staging.acquire(local.device());
        }
        int entry = 0;
        long entryDone = 0;
        while (entry < batch.count()) {
          // Fill one frame.
          int n = 0;
          while (entry < batch.count() && n < TcpWire.MAX_ENTRIES) {
            long size = batch.sizes()[entry];
            if (size == 0) {
              entry++;
              continue;
            }
            long piece = Math.min(TcpWire.MAX_ENTRY_BYTES, size - entryDone);
            localOffsets[n] = batch.localOffsets()[entry] + entryDone;
            remoteOffsets[n] = batch.remoteOffsets()[entry] + entryDone;
            lengths[n] = piece;
            n++;
            entryDone += piece;
            if (entryDone == size) {
              entry++;
              entryDone = 0;
            }
          }
          if (n == 0) {
            break;
          }
          frame.clear()
              .put(toRemote ? TcpWire.OP_WRITE : TcpWire.OP_READ)
              .putInt(remote.regionId())
              .putInt(n);
          for (int i = 0; i < n; i++) {
            frame.putLong(remoteOffsets[i]).putLong(lengths[i]);
          }
          TcpWire.writeFully(channel, frame.flip(), progress);
          framesSent++;
          if (toRemote) {
            // Acks of earlier frames wait in the socket; they are a few bytes each.
            if (lane != null) {
              lane.startSend(local.address(), localOffsets, lengths, n);
              lane.finishSend(channel, progress);
            } else {
              TcpWire.transferEntries(channel, Objects.requireNonNull(localSlots), iov, localOffsets,
                  lengths, n, false, progress);
            }
          } else {
            String refusal = TcpWire.readAck(channel, ack, progress);
            acksRead++;
            if (refusal != null) {
              return refusal;
            }
            if (lane != null) {
              lane.receive(channel, local.address(), localOffsets, lengths, n, progress);
            } else {
              TcpWire.transferEntries(channel, Objects.requireNonNull(localSlots), iov, localOffsets,
                  lengths, n, true, progress);
            }
          }
        }
        while (acksRead < framesSent) {
          String refusal = TcpWire.readAck(channel, ack, progress);
          acksRead++;
          if (refusal != null) {
            return refusal;
          }
        }
        return null;
      } catch (IOException e) {
        // The listener may have refused a frame and closed while we were still sending: its
        // reason is then waiting in our receive buffer, and worth more than "broken pipe". Not
        // after our own staging failed: the listener is still waiting for the frame's bytes.
        if (toRemote && !progress.timedOut && !(e instanceof PinnedStaging.StagingException)) {
          try {
            while (acksRead < framesSent) {
              String refusal = TcpWire.readAck(channel, ack, progress);
              acksRead++;
              if (refusal != null) {
                return refusal;
              }
            }
          } catch (IOException ignored) {
            // no reason was sent; report the original failure
          }
        }
        throw e;
      } finally {
        if (lane != null) {
          staging.release(lane);
        }
        progress.idle();
      }
    }

    /** Sends one DONE_WORD frame and reads its ack: null when stored, else the reason. */
    @Nullable String doneWord(byte[] name, int slot, long value) throws IOException {
      progress.busy();
      watchdog.watch(channel, progress, "tcp connection to " + endpoint);
      try {
        frame.clear()
            .put(TcpWire.OP_DONE_WORD)
            .putInt(slot)
            .putInt(name.length)
            .putLong(value)
            .put(name);
        TcpWire.writeFully(channel, frame.flip(), progress);
        return TcpWire.readAck(channel, ack, progress);
      } finally {
        progress.idle();
      }
    }

    private RegionSlots slotsFor(MemoryRegion region) {
      RegionSlots s = slots.get(region);
      if (s == null) {
        slots.keySet().removeIf(MemoryRegion::isClosed);
        s = new RegionSlots(region);
        slots.put(region, s);
      }
      return s;
    }

    void close() {
      open.remove(this);
      watchdog.forget(channel);
      try {
        channel.close();
      } catch (IOException ignored) {
        // closing is all we wanted
      }
    }
  }
}
