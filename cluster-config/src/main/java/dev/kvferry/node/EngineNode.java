package dev.kvferry.node;

import com.typesafe.config.Config;
import dev.kvferry.actors.EngineActor;
import dev.kvferry.actors.connector.ConnectorScheduler;
import dev.kvferry.actors.connector.ConnectorWorker;
import dev.kvferry.actors.engine.EngineIdentity;
import dev.kvferry.rdma.MemoryRegion;
import dev.kvferry.rdma.RegionRegistry;
import dev.kvferry.rdma.Transport;
import dev.kvferry.rdma.Transports;
import dev.kvferry.sim.SimEngineActor;
import dev.kvferry.sim.SimulatedEngine;
import java.io.IOException;
import java.time.Clock;
import java.util.ArrayList;
import java.util.List;
import org.apache.pekko.actor.typed.ActorRef;
import org.apache.pekko.actor.typed.ActorSystem;
import org.apache.pekko.actor.typed.Props;
import org.apache.pekko.actor.typed.javadsl.Behaviors;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * One engine node: an actor system in the cluster with role prefill or decode, one worker per TP
 * rank with its registered KV cache and transport, the connector's scheduler side, and (when
 * enabled) the simulated engine driving them.
 */
public final class EngineNode implements NodeRuntime, AutoCloseable {

  private static final Logger log = LoggerFactory.getLogger(EngineNode.class);

  private final ActorSystem<Void> system;
  private final NodeSettings settings;
  private final NodeMetrics metrics = new NodeMetrics();
  private final List<RegionRegistry> registries = new ArrayList<>();
  private final List<ConnectorWorker> workers = new ArrayList<>();
  private final ConnectorScheduler scheduler;
  private SimulatedEngine simulator;
  private volatile boolean ready;

  private EngineNode(Config config) throws IOException {
    this.settings = NodeSettings.fromConfig(config);
    this.system = ActorSystem.create(Behaviors.empty(), "kvferry", config);
    NodeRuntime.register(this);
    try {
      List<ActorRef<EngineActor.Command>> refs = new ArrayList<>();
      List<List<MemoryRegion>> layersByRank = new ArrayList<>();
      for (int tp = 0; tp < settings.tpSize(); tp++) {
        EngineIdentity id =
            new EngineIdentity(
                settings.role(), settings.engineId(), settings.dpRank(), settings.dpSize(), tp,
                settings.tpSize(), settings.mode());
        RegionRegistry registry = new RegionRegistry(id.label());
        registries.add(registry);
        List<MemoryRegion> layers = new ArrayList<>();
        for (int l = 0; l < settings.layers(); l++) {
          layers.add(registry.allocateHost(settings.geometry().layerRegionBytes()));
        }
        Transport transport =
            Transports.open(settings.transport(), registry, settings.transportOptions());
        ConnectorWorker worker =
            new ConnectorWorker(system, id, transport, settings.connector(), metrics);
        worker.registerKvCaches(settings.geometry(), layers);
        workers.add(worker);
        refs.add(worker.engineRef());
        layersByRank.add(layers);
      }
      this.scheduler =
          new ConnectorScheduler(
              settings.role(), settings.mode(), settings.engineId(), settings.dpRank(),
              settings.geometry().blockSize(), refs, settings.connector(), Clock.systemUTC());
      if (settings.simulatedEngine()) {
        if (settings.tpSize() != 1) {
          log.warn("the simulated engine drives TP size 1 only; node runs without it");
        } else {
          simulator =
              new SimulatedEngine(
                  settings.role(), settings.engineId(), settings.geometry(), layersByRank.get(0),
                  scheduler, workers.get(0), 512, settings.engineId().hashCode());
          simulator.start();
          system.systemActorOf(
              SimEngineActor.create(simulator), workers.get(0).identity().toActorName(),
              Props.empty());
        }
      }
      ready = true;
    } catch (IOException | RuntimeException e) {
      close();
      throw e;
    }
  }

  /** Starts a node from a complete config (reference.conf with the caller's overrides). */
  public static EngineNode start(Config config) throws IOException {
    return new EngineNode(config);
  }

  public NodeSettings settings() {
    return settings;
  }

  public ConnectorScheduler scheduler() {
    return scheduler;
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
    return List.copyOf(workers);
  }

  @Override
  public boolean transportBound() {
    return ready;
  }

  @Override
  public boolean handshakeServed() {
    return ready && workers.stream().allMatch(ConnectorWorker::isRegistered);
  }

  @Override
  public NodeMetrics metrics() {
    return metrics;
  }

  @Override
  public void close() {
    if (simulator != null) {
      simulator.close();
    }
    workers.forEach(ConnectorWorker::shutdown);
    workers.forEach(w -> w.transport().close());
    NodeRuntime.unregister(this);
    system.terminate();
    try {
      // Transfers in flight use the regions: free them only once the actors are gone.
      system.getWhenTerminated().toCompletableFuture().get(30, java.util.concurrent.TimeUnit.SECONDS);
      registries.forEach(RegionRegistry::close);
    } catch (Exception e) {
      log.warn("actor system did not stop in time; leaving KV regions mapped until exit", e);
    }
  }
}
