package dev.kvferry.engine.port;

import dev.kvferry.actors.connector.TransferMode;
import java.io.IOException;
import java.net.StandardProtocolFamily;
import java.net.UnixDomainSocketAddress;
import java.nio.channels.ClosedChannelException;
import java.nio.channels.ServerSocketChannel;
import java.nio.channels.SocketChannel;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.attribute.PosixFilePermissions;
import java.nio.file.attribute.UserPrincipal;
import java.time.Duration;
import java.util.List;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import jdk.net.ExtendedSocketOptions;
import jdk.net.UnixDomainPrincipal;
import org.jspecify.annotations.Nullable;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The engine port (docs/engine-port.md): a Unix domain socket through which one engine process
 * drives this node's connector. Each connection runs on a thread of its own; the first hello
 * attaches an engine, and the engine detaches when any of its connections closes.
 */
public final class EnginePortServer implements AutoCloseable {

  private static final Logger log = LoggerFactory.getLogger(EnginePortServer.class);

  private final PortHost host;
  private final Path socketPath;
  private final Duration workersTimeout;
  private final ServerSocketChannel server;
  private final UserPrincipal owner;
  private final Thread acceptor;
  private final Set<PortSession> sessions = ConcurrentHashMap.newKeySet();
  private @Nullable PortEngine engine;
  private int incarnations;
  private volatile boolean closed;

  private EnginePortServer(PortHost host, Path socketPath, Duration workersTimeout)
      throws IOException {
    this.host = host;
    this.socketPath = socketPath;
    this.workersTimeout = workersTimeout;
    removeStaleSocket(socketPath);
    this.server = ServerSocketChannel.open(StandardProtocolFamily.UNIX);
    server.bind(UnixDomainSocketAddress.of(socketPath));
    // Before the first accept: the uid check below covers a peer that connects in between.
    Files.setPosixFilePermissions(socketPath, PosixFilePermissions.fromString("rw-------"));
    this.owner = Files.getOwner(socketPath);
    this.acceptor = new Thread(this::acceptLoop, "kvferry-engine-port");
    acceptor.setDaemon(true);
  }

  /** Binds {@code socketPath} (a stale socket of a dead node is replaced) and starts serving. */
  public static EnginePortServer start(PortHost host, Path socketPath, Duration workersTimeout)
      throws IOException {
    EnginePortServer s = new EnginePortServer(host, socketPath, workersTimeout);
    s.acceptor.start();
    log.info("engine port listening on {}", socketPath);
    return s;
  }

  public Path socketPath() {
    return socketPath;
  }

  PortHost host() {
    return host;
  }

  /** Whether an engine is attached now (some of its connections said hello). */
  public synchronized boolean engineAttached() {
    return engine != null;
  }

  private static void removeStaleSocket(Path path) throws IOException {
    if (!Files.exists(path, java.nio.file.LinkOption.NOFOLLOW_LINKS)) {
      return;
    }
    if (Files.isRegularFile(path, java.nio.file.LinkOption.NOFOLLOW_LINKS)
        || Files.isDirectory(path, java.nio.file.LinkOption.NOFOLLOW_LINKS)) {
      throw new IOException(path + " exists and is not a socket; refusing to replace it");
    }
    boolean answered;
    try {
      SocketChannel.open(UnixDomainSocketAddress.of(path)).close();
      answered = true;
    } catch (IOException e) {
      answered = false; // nobody answers: a dead node's socket
    }
    if (answered) {
      throw new IOException("another process serves " + path + " already");
    }
    Files.delete(path);
  }

  private void acceptLoop() {
    while (!closed) {
      SocketChannel c;
      try {
        c = server.accept();
      } catch (ClosedChannelException e) {
        return;
      } catch (IOException e) {
        if (!closed) {
          log.warn("engine port: accept failed", e);
        }
        continue;
      }
      PortSession session = new PortSession(this, c, workersTimeout);
      String refusal = peerRefusal(c);
      if (refusal != null) {
        log.warn("engine port: refused a connection: {}", refusal);
        session.refuse(new PortException(PortError.UNAUTHORIZED, refusal));
        continue;
      }
      sessions.add(session);
      Thread t = new Thread(session, "kvferry-engine-port-session");
      t.setDaemon(true);
      t.start();
    }
  }

  /** Why the peer may not connect (another uid), or null. */
  private @Nullable String peerRefusal(SocketChannel c) {
    try {
      UnixDomainPrincipal peer = c.getOption(ExtendedSocketOptions.SO_PEERCRED);
      if (!peer.user().equals(owner)) {
        return "peer user " + peer.user().getName() + " is not the node's user "
            + owner.getName();
      }
      return null;
    } catch (IOException | UnsupportedOperationException e) {
      return "cannot read the peer's credentials: " + e;
    }
  }

  /**
   * The engine a hello joins: the attached one, or a new one (waiting out one that is still
   * detaching). The identity fields the hello gives must match the node's.
   */
  synchronized PortEngine engineFor(PortArgs identity) throws PortException {
    if (closed) {
      throw new PortException(PortError.NODE_STOPPING, "the node is stopping");
    }
    long deadline = System.nanoTime() + Duration.ofSeconds(30).toNanos();
    while (engine != null && engine.detaching()) {
      long left = deadline - System.nanoTime();
      if (left <= 0) {
        throw new PortException(PortError.ENGINE_BUSY, "the previous engine is still detaching");
      }
      try {
        java.util.concurrent.TimeUnit.NANOSECONDS.timedWait(this, left);
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
        throw new PortException(PortError.NODE_STOPPING, "interrupted");
      }
    }
    TransferMode mode = mode(identity);
    if (engine != null) {
      if (engine.mode() != mode) {
        throw new PortException(PortError.IDENTITY_MISMATCH, "hello names mode "
            + mode.configName() + "; the attached engine runs " + engine.mode().configName());
      }
      return engine;
    }
    engine = new PortEngine(host, this, ++incarnations, mode);
    return engine;
  }

  private TransferMode mode(PortArgs id) throws PortException {
    List<TransferMode> modes = host.modes();
    TransferMode mode;
    String named = id.optionalString("mode");
    if (named == null) {
      if (modes.size() != 1) {
        throw PortException.badArgs("args.engine.mode is required: this node serves "
            + modes.stream().map(TransferMode::configName).toList());
      }
      mode = modes.get(0);
    } else {
      try {
        mode = TransferMode.parse(named);
      } catch (IllegalArgumentException e) {
        throw PortException.badArgs("args.engine.mode must be write or read, got " + named);
      }
      if (!modes.contains(mode)) {
        throw mismatch("mode", named, modes.stream().map(TransferMode::configName).toList());
      }
    }
    String role = id.optionalString("role");
    if (role != null && !role.equalsIgnoreCase(host.role().clusterRole())) {
      throw mismatch("role", role, host.role().clusterRole());
    }
    String engineId = id.optionalString("engine_id");
    if (engineId != null && !engineId.equals(host.engineId(mode))) {
      throw mismatch("engine_id", engineId, host.engineId(mode));
    }
    checkInt(id, "dp_rank", host.dpRank());
    checkInt(id, "dp_size", host.dpSize());
    checkInt(id, "tp_size", host.tpSize());
    return mode;
  }

  private static void checkInt(PortArgs id, String key, int nodes) throws PortException {
    if (id.has(key) && id.integer(key, 0) != nodes) {
      throw mismatch(key, id.integer(key, 0), nodes);
    }
  }

  private static PortException mismatch(String key, Object hello, Object node) {
    return new PortException(PortError.IDENTITY_MISMATCH,
        "hello names " + key + " " + hello + "; this node has " + node);
  }

  /**
   * A hello that failed after {@link #engineFor} made its engine: an engine no connection joined
   * is forgotten, or the node would hold its identity (the mode the first hello named) for good.
   */
  synchronized void forgetIfUnjoined(PortEngine e) {
    if (engine == e && !e.detaching() && e.unjoined()) {
      engine = null;
      notifyAll();
    }
  }

  synchronized void engineGone(PortEngine gone) {
    if (engine == gone) {
      engine = null;
    }
    notifyAll();
  }

  void sessionEnded(PortSession s) {
    sessions.remove(s);
  }

  /** Stops accepting, detaches the engine (its transfers fail at the peers), removes the socket. */
  @Override
  public void close() {
    PortEngine e;
    synchronized (this) {
      if (closed) {
        return;
      }
      closed = true;
      e = engine;
    }
    try {
      server.close();
    } catch (IOException ignored) {
      // closing is best effort
    }
    if (e != null) {
      e.detach("the node is stopping");
    }
    sessions.forEach(PortSession::closeQuietly);
    try {
      Files.deleteIfExists(socketPath);
    } catch (IOException ex) {
      log.warn("engine port: could not remove {}", socketPath, ex);
    }
  }
}
