package dev.kvferry.rdma;

import dev.kvferry.rdma.cuda.SharedDoneWords;
import java.io.IOException;
import java.net.InetSocketAddress;
import java.net.SocketAddress;
import java.net.StandardSocketOptions;
import java.nio.ByteBuffer;
import java.nio.channels.ClosedChannelException;
import java.nio.channels.ServerSocketChannel;
import java.nio.channels.SocketChannel;
import java.util.IdentityHashMap;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.locks.LockSupport;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;
import org.jspecify.annotations.Nullable;

/**
 * Serves the regions of one {@link RegionRegistry} over TCP ({@link TcpWire} protocol): one thread
 * per connection, blocking channels, bytes read from the socket straight into the region. A
 * connection that presents a bad token or sends a bad frame is answered with the reason and
 * closed; the listener and the other connections carry on. Frames for a GPU region are staged
 * through pinned host buffers ({@link PinnedStaging}).
 */
final class TcpListener implements AutoCloseable {
  private static final Logger log = LoggerFactory.getLogger(TcpListener.class);

  private final RegionRegistry registry;
  private final TransportOptions options;
  private final IoWatchdog watchdog;
  private final PinnedStaging staging;
  /** This process's own done-word files by name: the only ones a DONE_WORD frame may store into. */
  private final Map<String, SharedDoneWords> doneWords;
  private final ServerSocketChannel server;
  private final InetSocketAddress boundAddress;
  private final Set<Connection> connections = ConcurrentHashMap.newKeySet();
  private final ExecutorService handlers;
  private final Thread acceptor;
  private volatile boolean closed;

  TcpListener(
      RegionRegistry registry, TransportOptions options, IoWatchdog watchdog,
      PinnedStaging staging, Map<String, SharedDoneWords> doneWords) throws IOException {
    this.registry = registry;
    this.options = options;
    this.watchdog = watchdog;
    this.staging = staging;
    this.doneWords = doneWords;
    this.server = ServerSocketChannel.open();
    try {
      server.setOption(StandardSocketOptions.SO_REUSEADDR, true);
      if (options.tcpSocketBufferBytes() > 0) {
        // Set before bind so accepted sockets negotiate a window scale that fits it.
        server.setOption(StandardSocketOptions.SO_RCVBUF, options.tcpSocketBufferBytes());
      }
      server.bind(new InetSocketAddress(options.tcpBindHost(), options.tcpPort()), 128);
    } catch (IOException e) {
      server.close();
      throw new IOException(
          "cannot listen on " + options.tcpBindHost() + ":" + options.tcpPort() + " for "
              + registry.owner() + ": " + e.getMessage(), e);
    }
    this.boundAddress = (InetSocketAddress) server.getLocalAddress();
    AtomicInteger n = new AtomicInteger();
    this.handlers =
        Executors.newCachedThreadPool(
            r -> {
              Thread t =
                  new Thread(r, "kvferry-tcp-" + boundAddress.getPort() + "-conn-" + n.incrementAndGet());
              t.setDaemon(true);
              return t;
            });
    this.acceptor = new Thread(this::acceptLoop, "kvferry-tcp-" + boundAddress.getPort() + "-accept");
    acceptor.setDaemon(true);
    acceptor.start();
  }

  InetSocketAddress boundAddress() {
    return boundAddress;
  }

  int activeConnections() {
    return connections.size();
  }

  private void acceptLoop() {
    while (!closed) {
      SocketChannel channel;
      try {
        channel = server.accept();
      } catch (ClosedChannelException e) {
        return;
      } catch (IOException e) {
        if (!closed) {
          // Out of file descriptors and the like: say so and back off instead of spinning.
          log.warn("tcp listener {}: accept failed: {}", boundAddress, e.toString());
          LockSupport.parkNanos(TimeUnit.MILLISECONDS.toNanos(50));
        }
        continue;
      }
      SocketAddress peer = remoteAddress(channel);
      if (connections.size() >= options.maxConnections()) {
        log.warn(
            "tcp listener {}: refused connection from {}: already serving {} connections",
            boundAddress, peer, options.maxConnections());
        closeQuietly(channel);
        continue;
      }
      try {
        channel.setOption(StandardSocketOptions.TCP_NODELAY, true);
        channel.setOption(StandardSocketOptions.SO_KEEPALIVE, true);
        if (options.tcpSocketBufferBytes() > 0) {
          channel.setOption(StandardSocketOptions.SO_SNDBUF, options.tcpSocketBufferBytes());
        }
        Connection connection = new Connection(channel, peer);
        connections.add(connection);
        handlers.execute(connection);
      } catch (IOException | RuntimeException e) {
        log.warn("tcp listener {}: dropped connection from {}: {}", boundAddress, peer, e.toString());
        closeQuietly(channel);
      }
    }
  }

  /**
   * Stops listening; once this returns the port is free to bind again. A channel closed while
   * another thread is blocked in its accept releases the socket only when that thread leaves
   * accept, so the acceptor is waited for (a CI run rebinding the port right after close found it
   * still in use).
   */
  @Override
  public void close() {
    closed = true;
    closeQuietly(server);
    if (Thread.currentThread() != acceptor) {
      try {
        acceptor.join(TimeUnit.SECONDS.toMillis(5));
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
      }
    }
    for (Connection c : connections) {
      closeQuietly(c.channel);
    }
    handlers.shutdownNow();
  }

  private static @Nullable SocketAddress remoteAddress(SocketChannel channel) {
    try {
      return channel.getRemoteAddress();
    } catch (IOException e) {
      return null;
    }
  }

  private static void closeQuietly(java.nio.channels.Channel channel) {
    try {
      channel.close();
    } catch (IOException ignored) {
      // nothing left to do with it
    }
  }

  /** What the peer did wrong; the connection is answered with it and closed. */
  private static final class Refusal extends Exception {
    private static final long serialVersionUID = 1L;

    Refusal(@Nullable String reason) {
      super(reason, null, false, false);
    }
  }

  /** One accepted connection: hello, then frames until the peer closes or misbehaves. */
  private final class Connection implements Runnable {
    final SocketChannel channel;
    final @Nullable SocketAddress peer;
    final TcpWire.Progress progress = new TcpWire.Progress();
    final ByteBuffer header = ByteBuffer.allocateDirect(TcpWire.FRAME_HEADER_BYTES);
    final ByteBuffer entries =
        ByteBuffer.allocateDirect(TcpWire.MAX_ENTRIES * TcpWire.ENTRY_BYTES);
    final ByteBuffer ack =
        ByteBuffer.allocateDirect(TcpWire.ACK_HEADER_BYTES + TcpWire.MAX_MESSAGE_BYTES);
    final long[] offsets = new long[TcpWire.MAX_ENTRIES];
    final long[] lengths = new long[TcpWire.MAX_ENTRIES];
    final ByteBuffer[] iov = new ByteBuffer[RegionSlots.SLOTS];
    final Map<MemoryRegion, RegionSlots> slots = new IdentityHashMap<>();

    Connection(SocketChannel channel, @Nullable SocketAddress peer) {
      this.channel = channel;
      this.peer = peer;
    }

    @Override
    public void run() {
      progress.busy(); // the hello is due within the I/O timeout
      watchdog.watch(channel, progress, "tcp connection from " + peer + " to " + boundAddress);
      try {
        hello();
        progress.idle();
        while (frame()) {
          progress.idle();
        }
      } catch (Refusal r) {
        log.warn("tcp listener {}: closed connection from {}: {}", boundAddress, peer, r.getMessage());
        try {
          TcpWire.writeFully(channel, TcpWire.ack(ack, r.getMessage()), progress);
        } catch (IOException ignored) {
          // the peer may be gone already; the log says why we closed
        }
      } catch (TcpWire.TruncatedException e) {
        log.warn("tcp listener {}: closed connection from {}: {}", boundAddress, peer, e.getMessage());
      } catch (IOException e) {
        if (!closed) {
          log.warn(
              "tcp listener {}: closed connection from {}: {}{}", boundAddress, peer,
              progress.timedOut ? "no progress within the I/O timeout; " : "", e.toString());
        }
      } finally {
        watchdog.forget(channel);
        connections.remove(this);
        closeQuietly(channel);
      }
    }

    private void hello() throws IOException, Refusal {
      ByteBuffer hello = header.clear().limit(6);
      TcpWire.readFully(channel, hello, progress, "hello");
      if (hello.getInt(0) != TcpWire.MAGIC) {
        throw new Refusal("garbage hello: not a kvferry tcp peer");
      }
      if (hello.get(4) != TcpWire.VERSION) {
        throw new Refusal(
            "unsupported protocol version " + hello.get(4) + " (this listener speaks "
                + TcpWire.VERSION + ")");
      }
      int tokenLength = hello.get(5) & 0xFF;
      if (tokenLength == 0 || tokenLength > TcpWire.MAX_TOKEN_BYTES) {
        throw new Refusal(
            "token of " + tokenLength + " bytes (expected 1.." + TcpWire.MAX_TOKEN_BYTES + ")");
      }
      ByteBuffer token = entries.clear().limit(tokenLength);
      TcpWire.readFully(channel, token, progress, "token");
      byte[] presented = new byte[tokenLength];
      token.flip().get(presented);
      if (!registry.tokenMatches(presented)) {
        throw new Refusal("bad token for the regions of " + owner());
      }
      TcpWire.writeFully(channel, TcpWire.ack(ack, null), progress);
    }

    /** Serves one frame; false when the peer closed cleanly between frames. */
    private boolean frame() throws IOException, Refusal {
      header.clear();
      if (channel.read(header) < 0) {
        log.debug("tcp listener {}: {} closed its connection", boundAddress, peer);
        return false;
      }
      progress.busy();
      TcpWire.readFully(channel, header, progress, "frame header");
      byte op = header.get(0);
      if (op == TcpWire.OP_DONE_WORD) {
        doneWord(header.getInt(1), header.getInt(5));
        return true;
      }
      int regionId = header.getInt(1);
      int count = header.getInt(5);
      if (op != TcpWire.OP_WRITE && op != TcpWire.OP_READ) {
        throw new Refusal("garbage frame: unknown op " + op);
      }
      if (count < 1 || count > TcpWire.MAX_ENTRIES) {
        throw new Refusal(
            "frame of " + count + " entries (expected 1.." + TcpWire.MAX_ENTRIES + ")");
      }
      entries.clear().limit(count * TcpWire.ENTRY_BYTES);
      TcpWire.readFully(channel, entries, progress, "frame entries");
      for (int i = 0; i < count; i++) {
        offsets[i] = entries.getLong(i * TcpWire.ENTRY_BYTES);
        lengths[i] = entries.getLong(i * TcpWire.ENTRY_BYTES + 8);
      }
      MemoryRegion region = registry.lookup(regionId);
      if (region == null || !region.tryPin()) {
        throw new Refusal("region " + regionId + " is not registered at " + owner());
      }
      PinnedStaging.Lane lane = null;
      try {
        for (int i = 0; i < count; i++) {
          if (lengths[i] > TcpWire.MAX_ENTRY_BYTES) {
            throw new Refusal(
                "oversized entry of " + lengths[i] + " bytes (at most " + TcpWire.MAX_ENTRY_BYTES
                    + ")");
          }
          try {
            region.checkRange(offsets[i], lengths[i]);
          } catch (RegionBoundsException e) {
            throw new Refusal(e.getMessage());
          }
        }
        if (region.kind() == RegionKind.CUDA) {
          try {
            lane = staging.acquire(region.device());
          } catch (PinnedStaging.StagingException e) {
            throw new Refusal(
                "region " + regionId + " of " + owner() + " is GPU memory and cannot be staged "
                    + "here: " + e.getMessage());
          }
          gpuFrame(op, region, lane, count);
        } else {
          RegionSlots regionSlots = slotsFor(region);
          if (op == TcpWire.OP_WRITE) {
            TcpWire.transferEntries(channel, regionSlots, iov, offsets, lengths, count, true, progress);
            TcpWire.writeFully(channel, TcpWire.ack(ack, null), progress);
          } else {
            TcpWire.writeFully(channel, TcpWire.ack(ack, null), progress);
            TcpWire.transferEntries(channel, regionSlots, iov, offsets, lengths, count, false, progress);
          }
        }
      } finally {
        if (lane != null) {
          staging.release(lane);
        }
        region.unpin();
      }
      return true;
    }

    /**
     * A DONE_WORD frame: stores its value into word {@code slot} of one of this process's own
     * done-word files. Frames of a connection are served one after another, so every byte of the
     * frames before it has landed by now; the release store publishes them with the word.
     */
    private void doneWord(int slot, int nameLength) throws IOException, Refusal {
      if (nameLength < 1 || nameLength > TcpWire.MAX_DONE_WORD_NAME_BYTES) {
        throw new Refusal("done word with a name of " + nameLength + " bytes (expected 1.."
            + TcpWire.MAX_DONE_WORD_NAME_BYTES + ")");
      }
      ByteBuffer body = entries.clear().limit(Long.BYTES + nameLength);
      TcpWire.readFully(channel, body, progress, "done word");
      long value = body.getLong(0);
      byte[] raw = new byte[nameLength];
      body.position(Long.BYTES);
      body.get(raw);
      String name = new String(raw, java.nio.charset.StandardCharsets.US_ASCII);
      SharedDoneWords words = doneWords.get(name);
      if (words == null) {
        throw new Refusal("done word for '" + name + "' refused: not a done-word file of "
            + owner() + "; nothing was stored");
      }
      if (slot < 0 || slot >= words.slots()) {
        throw new Refusal("done word " + slot + " refused: " + name + " of " + owner() + " holds "
            + words.slots() + " words; nothing was stored");
      }
      words.store(slot, value);
      TcpWire.writeFully(channel, TcpWire.ack(ack, null), progress);
    }

    /**
     * A frame for GPU memory, staged through {@code lane}. A staging failure while the writer's
     * bytes arrive, or before a READ's first byte is ready, is answered like a refusal (a write's
     * bytes may partly have landed in the region, never outside it); once a READ's ok ack is out,
     * a failure can only close the connection.
     */
    private void gpuFrame(byte op, MemoryRegion region, PinnedStaging.Lane lane, int count)
        throws IOException, Refusal {
      if (op == TcpWire.OP_WRITE) {
        try {
          lane.receive(channel, region.address(), offsets, lengths, count, progress);
        } catch (PinnedStaging.StagingException e) {
          throw new Refusal(
              "write into region " + region.id() + " of " + owner() + " failed: " + e.getMessage());
        }
        TcpWire.writeFully(channel, TcpWire.ack(ack, null), progress);
      } else {
        try {
          lane.startSend(region.address(), offsets, lengths, count);
        } catch (PinnedStaging.StagingException e) {
          throw new Refusal(
              "read from region " + region.id() + " of " + owner() + " failed: " + e.getMessage());
        }
        try {
          TcpWire.writeFully(channel, TcpWire.ack(ack, null), progress);
        } catch (IOException e) {
          lane.abandonSend(); // the lane goes back only once its copies are done
          throw e;
        }
        lane.finishSend(channel, progress);
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

    private String owner() {
      return registry.owner().isEmpty() ? "this listener" : registry.owner();
    }
  }
}
