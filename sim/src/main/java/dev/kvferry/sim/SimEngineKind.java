package dev.kvferry.sim;

import com.typesafe.config.Config;
import dev.kvferry.actors.connector.ConnectorScheduler;
import dev.kvferry.actors.connector.ConnectorWorker;
import dev.kvferry.engine.EngineDriver;
import dev.kvferry.engine.EngineKind;
import dev.kvferry.engine.EngineSetup;
import dev.kvferry.rdma.MemoryRegion;
import dev.kvferry.rdma.RegionRegistry;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.locks.LockSupport;
import org.apache.pekko.actor.typed.ActorSystem;
import org.apache.pekko.actor.typed.Props;
import org.jspecify.annotations.Nullable;

/**
 * The engine kind {@code sim}: the simulated engine drives the node's connector, fills P's KV cache
 * with {@link KvPattern} and checks every byte D receives; it takes requests from routers through
 * its {@link SimEngineActor}.
 */
public final class SimEngineKind implements EngineKind {

  @Override
  public String name() {
    return "sim";
  }

  @Override
  public String description() {
    return "the simulated engine: pattern-filled KV, every byte checked on D";
  }

  @Override
  public EngineDriver create(EngineSetup setup) {
    return new Driver(setup, allocate(setup));
  }

  private static SimKvCache allocate(EngineSetup setup) {
    if (setup.onGpu()) {
      return new GpuKvCache(setup.gpu(), setup.geometry(), setup.layers(), setup.rankRegistries());
    }
    List<List<MemoryRegion>> byRank = new ArrayList<>();
    for (RegionRegistry registry : setup.rankRegistries()) {
      List<MemoryRegion> layers = new ArrayList<>();
      for (int l = 0; l < setup.layers(); l++) {
        layers.add(registry.allocateHost(setup.geometry().layerRegionBytes()));
      }
      byRank.add(layers);
    }
    return new HostKvCache(setup.geometry(), byRank);
  }

  /**
   * After each layer is handed to the connector, the simulated compute time of the next ({@code
   * kvferry.node.simulated-layer-compute}; 0: as fast as the fill goes).
   */
  static SimulatedEngine.LayerListener layerCompute(Config node) {
    Duration perLayer =
        node.hasPath("simulated-layer-compute")
            ? node.getDuration("simulated-layer-compute")
            : Duration.ZERO;
    if (perLayer.isNegative()) {
      throw new IllegalArgumentException(
          "kvferry.node.simulated-layer-compute must not be negative, got " + perLayer);
    }
    if (perLayer.isZero()) {
      return SimulatedEngine.LayerListener.NONE;
    }
    long nanos = perLayer.toNanos();
    return (layer, layers, firedNanos) -> {
      if (layer < layers - 1) {
        LockSupport.parkNanos(nanos);
      }
    };
  }

  /** Steps the simulated engine allows per scheduler step (tokens). */
  private static final int TOKENS_PER_STEP = 512;

  private static final class Driver implements EngineDriver {
    private final EngineSetup setup;
    private final SimKvCache cache;
    private @Nullable SimulatedEngine simulator;

    Driver(EngineSetup setup, SimKvCache cache) {
      this.setup = setup;
      this.cache = cache;
    }

    @Override
    public List<MemoryRegion> layerRegions(int rank) {
      return cache.layerRegions(rank);
    }

    @Override
    public void start(
        ActorSystem<?> system, ConnectorScheduler scheduler, List<ConnectorWorker> workers) {
      // One simulated engine drives every TP rank; each rank's cache holds its share of the heads.
      simulator =
          new SimulatedEngine(
              setup.role(), setup.engineId(), setup.geometry(), cache, scheduler, workers,
              TOKENS_PER_STEP, setup.engineId().hashCode(), layerCompute(setup.nodeConfig()));
      simulator.start();
      system.systemActorOf(
          SimEngineActor.create(simulator), "sim~" + workers.get(0).identity().toActorName(),
          Props.empty());
    }

    @Override
    public void stop() {
      if (simulator != null) {
        simulator.close();
      }
    }

    @Override
    public void close() {
      // A GPU cache first waits for its stream, then hands its regions back.
      cache.close();
    }
  }
}
