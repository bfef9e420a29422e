package dev.kvferry.node;

import com.typesafe.config.Config;
import dev.kvferry.actors.EngineActor;
import dev.kvferry.actors.connector.ConnectorScheduler;
import dev.kvferry.actors.connector.ConnectorWorker;
import dev.kvferry.actors.connector.Role;
import dev.kvferry.actors.connector.TransferMode;
import dev.kvferry.actors.engine.ConnectorSettings;
import dev.kvferry.actors.engine.EngineIdentity;
import dev.kvferry.engine.port.EnginePortServer;
import dev.kvferry.engine.port.PortHost;
import dev.kvferry.rdma.CudaTransport;
import dev.kvferry.rdma.MemoryRegion;
import dev.kvferry.rdma.RegionRegistry;
import dev.kvferry.rdma.Transport;
import dev.kvferry.rdma.Transports;
import dev.kvferry.engine.EngineDriver;
import dev.kvferry.engine.EngineKind;
import dev.kvferry.engine.EngineKinds;
import dev.kvferry.engine.EngineSetup;
import dev.kvferry.rdma.cuda.Cuda;
import java.io.IOException;
import java.nio.file.Path;
import java.time.Clock;
import java.util.ArrayList;
import java.util.Collections;
import java.util.IdentityHashMap;
import java.util.List;
import java.util.Optional;
import java.util.Set;
import java.util.concurrent.TimeUnit;
import org.apache.pekko.actor.typed.ActorRef;
import org.apache.pekko.actor.typed.ActorSystem;
import org.apache.pekko.actor.typed.javadsl.Behaviors;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;
import org.jspecify.annotations.Nullable;

/**
 * One engine node: an actor system in the cluster with role prefill or decode hosting one engine
 * per configured transfer mode. Each engine has one worker per TP rank (its registered KV cache and
 * transport), the connector's scheduler side, and the driver of the engine kind the config names
 * ({@code kvferry.node.engine}: {@link EngineKinds}). The KV caches are in host memory, or with
 * {@code kvferry.node.gpu} on that GPU.
 */
public final class EngineNode implements NodeRuntime, PortHost, AutoCloseable {

  private static final Logger log = LoggerFactory.getLogger(EngineNode.class);

  /** One engine (one DP rank in one mode) of this node. */
  public record Engine(
      String engineId,
      TransferMode mode,
      List<ConnectorWorker> workers,
      ConnectorScheduler scheduler,
      EngineDriver driver) {}

  private final ActorSystem<Void> system;
  private final NodeSettings settings;
  private final NodeMetrics metrics = new NodeMetrics();
  private final List<RegionRegistry> registries = new ArrayList<>();
  private final @Nullable EngineKind engineKind;
  /** With {@code kvferry.node.engine = "port"}: the socket an engine process drives us through. */
  private @Nullable EnginePortServer port;
  /** {@code kvferry.node}: engine kinds read their own settings from it. */
  private final Config nodeConfig;
  /** With the cuda transport, the one every worker of the node uses (see openTransport). */
  private @Nullable Transport cudaTransport;
  private final List<Engine> engines = new java.util.concurrent.CopyOnWriteArrayList<>();
  /** Drivers of engines whose workers failed to start: their KV caches go back at close too. */
  private final List<EngineDriver> failedDrivers = new ArrayList<>();
  private volatile boolean ready;

  private EngineNode(Config config) throws IOException {
    this.settings = NodeSettings.fromConfig(config);
    this.nodeConfig = config.getConfig("kvferry.node");
    // Before anything starts: "CUDA not available: <reason>", no such GPU, an unknown engine kind.
    if (settings.onGpu()) {
      Cuda.requireDevice(settings.gpu());
    }
    boolean served = settings.engine().equals(EngineKinds.PORT);
    this.engineKind = served ? null : EngineKinds.named(settings.engine());
    Path socket = served ? portSocket(nodeConfig) : null;
    this.system = ActorSystem.create(Behaviors.empty(), "kvferry", config);
    NodeRuntime.register(this);
    try {
      if (socket != null) {
        port = EnginePortServer.start(this, socket,
            nodeConfig.getDuration("engine-port.workers-timeout"));
      } else {
        for (TransferMode mode : settings.modes()) {
          startEngine(mode);
        }
      }
      ready = true;
    } catch (IOException | RuntimeException e) {
      // Log before close(): coordinated shutdown may exit the JVM before the caller sees it.
      log.error("engine node {} failed to start: {}", settings.engineId(), e.toString(), e);
      close();
      throw e;
    }
  }

  private static Path portSocket(Config node) {
    String socket = node.getString("engine-port.socket");
    if (socket.isBlank()) {
      throw new IllegalArgumentException(
          "kvferry.node.engine = \"port\" needs kvferry.node.engine-port.socket (--engine-socket)");
    }
    // With kvferry.node.gpu the engine may share GPU memory (cuda_ipc), opened on that GPU.
    return Path.of(socket).toAbsolutePath();
  }

  private void startEngine(TransferMode mode) throws IOException {
    EngineKind engineKind = java.util.Objects.requireNonNull(this.engineKind);
    String engineId = settings.engineIdFor(mode);
    List<ConnectorWorker> workers = new ArrayList<>();
    List<ActorRef<EngineActor.Command>> refs = new ArrayList<>();
    List<EngineIdentity> ids = new ArrayList<>();
    List<RegionRegistry> rankRegistries = new ArrayList<>();
    for (int tp = 0; tp < settings.tpSize(); tp++) {
      EngineIdentity id =
          new EngineIdentity(
              settings.role(), engineId, settings.dpRank(), settings.dpSize(), tp,
              settings.tpSize(), mode);
      ids.add(id);
      RegionRegistry registry = new RegionRegistry(id.label());
      registries.add(registry);
      rankRegistries.add(registry);
    }
    EngineDriver driver =
        engineKind.create(
            new EngineSetup(settings.role(), engineId, mode, settings.geometry(), settings.layers(),
                settings.gpu(), rankRegistries, nodeConfig));
    try {
      for (int tp = 0; tp < settings.tpSize(); tp++) {
        Transport transport = openTransport(rankRegistries.get(tp));
        ConnectorWorker worker =
            new ConnectorWorker(system, ids.get(tp), transport, settings.connector(), metrics);
        workers.add(worker);
        worker.registerKvCaches(settings.geometry(), driver.layerRegions(tp));
        refs.add(worker.engineRef());
      }
    } catch (RuntimeException e) {
      // Not listed in engines yet, so close() would not see these.
      workers.forEach(ConnectorWorker::shutdown);
      failedDrivers.add(driver);
      throw e;
    }
    ConnectorScheduler scheduler =
        new ConnectorScheduler(
            settings.role(), mode, engineId, settings.dpRank(), settings.geometry().blockSize(),
            refs, settings.connector(), Clock.systemUTC());
    Engine engine = new Engine(engineId, mode, List.copyOf(workers), scheduler, driver);
    engines.add(engine); // from here on close() stops it, also if start fails
    driver.start(system, scheduler, engine.workers());
  }

  /**
   * The transport of one worker. cuda: one for the whole node, because CUDA opens a peer's
   * allocation only once per process (a second cudaIpcOpenMemHandle of the same handle fails),
   * and with TP > 1 several workers reach the same peer layers.
   */
  private synchronized Transport openTransport(RegionRegistry registry) throws IOException {
    if (!settings.transport().equals("cuda")) {
      return Transports.open(settings.transport(), registry, settings.transportOptions());
    }
    // An engine served through the port closes its workers' transport when it detaches; the
    // engine that attaches next gets a fresh one.
    if (cudaTransport == null || cudaTransport instanceof CudaTransport c && c.isClosed()) {
      cudaTransport = Transports.open("cuda", registry, settings.transportOptions());
    }
    return cudaTransport;
  }

  /** Starts a node from a complete config (see {@link KvferryConfig}). */
  public static EngineNode start(Config config) throws IOException {
    return new EngineNode(config);
  }

  public NodeSettings settings() {
    return settings;
  }

  public List<Engine> engines() {
    return List.copyOf(engines);
  }

  @Override
  public String kind() {
    return settings.role().clusterRole();
  }

  @Override
  public ActorSystem<?> system() {
    return system;
  }

  @Override
  public List<ConnectorWorker> workers() {
    List<ConnectorWorker> all = new ArrayList<>();
    engines.forEach(e -> all.addAll(e.workers()));
    return all;
  }

  @Override
  public boolean transportBound() {
    return ready;
  }

  @Override
  public boolean handshakeServed() {
    return ready && workers().stream().allMatch(ConnectorWorker::isRegistered);
  }

  @Override
  public NodeMetrics metrics() {
    return metrics;
  }

  /** The engine port's socket, when this node serves an engine process. */
  public Optional<Path> engineSocket() {
    EnginePortServer p = port;
    return p == null ? Optional.empty() : Optional.of(p.socketPath());
  }

  // --- PortHost: what the engine port needs from this node ---

  @Override
  public String nodeName() {
    return settings.role().clusterRole() + "@" + system.address();
  }

  @Override
  public Role role() {
    return settings.role();
  }

  @Override
  public String engineId(TransferMode mode) {
    return settings.engineIdFor(mode);
  }

  @Override
  public int dpRank() {
    return settings.dpRank();
  }

  @Override
  public int dpSize() {
    return settings.dpSize();
  }

  @Override
  public int tpSize() {
    return settings.tpSize();
  }

  @Override
  public List<TransferMode> modes() {
    return settings.modes();
  }

  @Override
  public String transportName() {
    return settings.transport();
  }

  @Override
  public int gpu() {
    return settings.gpu();
  }

  @Override
  public ConnectorSettings connector() {
    return settings.connector();
  }

  @Override
  public ConnectorWorker newWorker(EngineIdentity id, RegionRegistry registry) throws IOException {
    return new ConnectorWorker(system, id, openTransport(registry), settings.connector(), metrics);
  }

  @Override
  public void engineAttached(String engineId, TransferMode mode, List<ConnectorWorker> workers,
      ConnectorScheduler scheduler) {
    engines.add(new Engine(engineId, mode, List.copyOf(workers), scheduler, PORT_DRIVER));
  }

  @Override
  public void engineDetached(String engineId) {
    engines.removeIf(e -> e.engineId().equals(engineId) && e.driver() == PORT_DRIVER);
  }

  /** The driver an engine served through the port is listed with: the engine process drives. */
  private static final EngineDriver PORT_DRIVER = new EngineDriver() {
    @Override
    public List<MemoryRegion> layerRegions(int rank) {
      return List.of();
    }

    @Override
    public void start(ActorSystem<?> system, ConnectorScheduler scheduler,
        List<ConnectorWorker> workers) {}

    @Override
    public void stop() {}

    @Override
    public void close() {}
  };

  @Override
  public void close() {
    EnginePortServer p = port;
    if (p != null) {
      p.close(); // detaches the engine process's engine: its workers stop, its memory unmaps
    }
    List<java.util.concurrent.CompletableFuture<Void>> stopped = new ArrayList<>();
    for (Engine e : engines) {
      e.driver().stop();
      e.workers().forEach(w -> stopped.add(w.stop()));
    }
    try {
      // The stops are messages: wait until the workers are gone before their transports go.
      java.util.concurrent.CompletableFuture.allOf(
              stopped.toArray(java.util.concurrent.CompletableFuture[]::new))
          .get(30, TimeUnit.SECONDS);
    } catch (Exception e) {
      log.warn("engine workers did not stop within 30 s; closing their transports anyway", e);
    }
    // Workers may share a transport (cuda): close each once, after every worker stopped.
    Set<Transport> transports = Collections.newSetFromMap(new IdentityHashMap<>());
    engines.forEach(e -> e.workers().forEach(w -> transports.add(w.transport())));
    transports.forEach(Transport::close);
    NodeRuntime.unregister(this);
    system.terminate();
    try {
      // Transfers in flight use the regions: free them only once the actors are gone.
      system.getWhenTerminated().toCompletableFuture().get(30, TimeUnit.SECONDS);
      // A GPU cache first waits for its stream, then hands its regions back.
      engines.forEach(e -> e.driver().close());
      failedDrivers.forEach(EngineDriver::close);
      registries.forEach(RegionRegistry::close);
    } catch (Exception e) {
      log.warn("actor system did not stop in time; leaving KV regions mapped until exit", e);
    }
  }
}
