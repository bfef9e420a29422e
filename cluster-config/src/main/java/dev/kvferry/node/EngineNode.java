package dev.kvferry.node;

import com.typesafe.config.Config;
import dev.kvferry.actors.EngineActor;
import dev.kvferry.actors.connector.ConnectorScheduler;
import dev.kvferry.actors.connector.ConnectorWorker;
import dev.kvferry.actors.connector.TransferMode;
import dev.kvferry.actors.engine.EngineIdentity;
import dev.kvferry.rdma.MemoryRegion;
import dev.kvferry.rdma.RegionRegistry;
import dev.kvferry.rdma.Transport;
import dev.kvferry.rdma.Transports;
import dev.kvferry.sim.GpuKvCache;
import dev.kvferry.sim.HostKvCache;
import dev.kvferry.sim.SimEngineActor;
import dev.kvferry.sim.SimKvCache;
import dev.kvferry.sim.SimulatedEngine;
import java.io.IOException;
import java.time.Clock;
import java.util.ArrayList;
import java.util.Collections;
import java.util.IdentityHashMap;
import java.util.List;
import java.util.Set;
import java.util.concurrent.TimeUnit;
import org.apache.pekko.actor.typed.ActorRef;
import org.apache.pekko.actor.typed.ActorSystem;
import org.apache.pekko.actor.typed.Props;
import org.apache.pekko.actor.typed.javadsl.Behaviors;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * One engine node: an actor system in the cluster with role prefill or decode hosting one engine
 * per configured transfer mode. Each engine has one worker per TP rank (its registered KV cache and
 * transport), the connector's scheduler side, and, when enabled, the simulated engine driving them.
 * The KV caches are in host memory, or with {@code kvferry.node.gpu} on that GPU.
 */
public final class EngineNode implements NodeRuntime, AutoCloseable {

  private static final Logger log = LoggerFactory.getLogger(EngineNode.class);

  /** One engine (one DP rank in one mode) of this node. */
  public record Engine(
      String engineId,
      TransferMode mode,
      List<ConnectorWorker> workers,
      ConnectorScheduler scheduler,
      SimulatedEngine simulator) {}

  private final ActorSystem<Void> system;
  private final NodeSettings settings;
  private final NodeMetrics metrics = new NodeMetrics();
  private final List<RegionRegistry> registries = new ArrayList<>();
  private final List<SimKvCache> caches = new ArrayList<>();
  /** With the cuda transport, the one every worker of the node uses (see openTransport). */
  private Transport cudaTransport;
  private final List<Engine> engines = new ArrayList<>();
  private volatile boolean ready;

  private EngineNode(Config config) throws IOException {
    this.settings = NodeSettings.fromConfig(config);
    if (settings.onGpu()) {
      // Before anything starts: "CUDA not available: <reason>" or no such GPU.
      GpuKvCache.requireDevice(settings.gpu());
    }
    this.system = ActorSystem.create(Behaviors.empty(), "kvferry", config);
    NodeRuntime.register(this);
    try {
      for (TransferMode mode : settings.modes()) {
        engines.add(startEngine(mode));
      }
      ready = true;
    } catch (IOException | RuntimeException e) {
      // Log before close(): coordinated shutdown may exit the JVM before the caller sees it.
      log.error("engine node {} failed to start: {}", settings.engineId(), e.toString(), e);
      close();
      throw e;
    }
  }

  private Engine startEngine(TransferMode mode) throws IOException {
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
    SimKvCache cache = allocateCache(rankRegistries);
    caches.add(cache);
    for (int tp = 0; tp < settings.tpSize(); tp++) {
      EngineIdentity id = ids.get(tp);
      List<MemoryRegion> layers = cache.layerRegions(tp);
      Transport transport = openTransport(rankRegistries.get(tp));
      ConnectorWorker worker =
          new ConnectorWorker(system, id, transport, settings.connector(), metrics);
      worker.registerKvCaches(settings.geometry(), layers);
      workers.add(worker);
      refs.add(worker.engineRef());
    }
    ConnectorScheduler scheduler =
        new ConnectorScheduler(
            settings.role(), mode, engineId, settings.dpRank(), settings.geometry().blockSize(),
            refs, settings.connector(), Clock.systemUTC());
    SimulatedEngine simulator = null;
    if (settings.simulatedEngine()) {
      // One simulated engine drives every TP rank; each rank's cache holds its share of the heads.
      simulator =
          new SimulatedEngine(
              settings.role(), engineId, settings.geometry(), cache, scheduler, workers, 512,
              engineId.hashCode(), layerCompute(settings.simulatedLayerCompute()));
      simulator.start();
      system.systemActorOf(
          SimEngineActor.create(simulator), "sim~" + workers.get(0).identity().toActorName(),
          Props.empty());
    }
    return new Engine(engineId, mode, List.copyOf(workers), scheduler, simulator);
  }

  /** After each layer is handed to the connector, the simulated compute time of the next. */
  private static SimulatedEngine.LayerListener layerCompute(java.time.Duration perLayer) {
    if (perLayer.isZero()) {
      return SimulatedEngine.LayerListener.NONE;
    }
    long nanos = perLayer.toNanos();
    return (layer, layers, firedNanos) -> {
      if (layer < layers - 1) {
        java.util.concurrent.locks.LockSupport.parkNanos(nanos);
      }
    };
  }

  /**
   * The transport of one worker. cuda: one for the whole node, because CUDA opens a peer's
   * allocation only once per process (a second cudaIpcOpenMemHandle of the same handle fails),
   * and with TP > 1 several workers reach the same peer layers.
   */
  private Transport openTransport(RegionRegistry registry) throws IOException {
    if (!settings.transport().equals("cuda")) {
      return Transports.open(settings.transport(), registry, settings.transportOptions());
    }
    if (cudaTransport == null) {
      cudaTransport = Transports.open("cuda", registry, settings.transportOptions());
    }
    return cudaTransport;
  }

  /** Each rank's layers, in its registry: in host memory, or on the node's GPU. */
  private SimKvCache allocateCache(List<RegionRegistry> rankRegistries) {
    if (settings.onGpu()) {
      return new GpuKvCache(settings.gpu(), settings.geometry(), settings.layers(), rankRegistries);
    }
    List<List<MemoryRegion>> byRank = new ArrayList<>();
    for (RegionRegistry registry : rankRegistries) {
      List<MemoryRegion> layers = new ArrayList<>();
      for (int l = 0; l < settings.layers(); l++) {
        layers.add(registry.allocateHost(settings.geometry().layerRegionBytes()));
      }
      byRank.add(layers);
    }
    return new HostKvCache(settings.geometry(), byRank);
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

  @Override
  public void close() {
    for (Engine e : engines) {
      if (e.simulator() != null) {
        e.simulator().close();
      }
      e.workers().forEach(ConnectorWorker::shutdown);
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
      caches.forEach(SimKvCache::close);
      registries.forEach(RegionRegistry::close);
    } catch (Exception e) {
      log.warn("actor system did not stop in time; leaving KV regions mapped until exit", e);
    }
  }
}
