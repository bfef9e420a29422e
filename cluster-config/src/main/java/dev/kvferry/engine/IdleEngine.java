package dev.kvferry.engine;

import dev.kvferry.actors.connector.ConnectorScheduler;
import dev.kvferry.actors.connector.ConnectorWorker;
import dev.kvferry.rdma.MemoryRegion;
import dev.kvferry.rdma.RegionKind;
import dev.kvferry.rdma.RegionRegistry;
import dev.kvferry.rdma.cuda.Cuda;
import java.util.ArrayList;
import java.util.List;
import org.apache.pekko.actor.typed.ActorSystem;

/**
 * The {@code none} engine: a zeroed KV cache (host memory or GPU) that nothing drives. The node
 * serves its handshake and transfers; useful to check a deployment's wiring before an engine runs.
 */
public final class IdleEngine implements EngineDriver {

  /** The built-in kind {@code none}. */
  public static final class Kind implements EngineKind {
    @Override
    public String name() {
      return "none";
    }

    @Override
    public String description() {
      return "a KV cache nothing drives";
    }

    @Override
    public EngineDriver create(EngineSetup setup) {
      return new IdleEngine(setup);
    }
  }

  private final List<List<MemoryRegion>> layersByRank = new ArrayList<>();

  private IdleEngine(EngineSetup setup) {
    long layerBytes = setup.geometry().layerRegionBytes();
    if (setup.onGpu()) {
      Cuda.requireDevice(setup.gpu());
      Cuda.setDevice(setup.gpu());
    }
    for (RegionRegistry registry : setup.rankRegistries()) {
      List<MemoryRegion> layers = new ArrayList<>();
      for (int l = 0; l < setup.layers(); l++) {
        layers.add(setup.onGpu() ? gpuLayer(registry, setup.gpu(), layerBytes)
            : registry.allocateHost(layerBytes));
      }
      layersByRank.add(List.copyOf(layers));
    }
  }

  private static MemoryRegion gpuLayer(RegionRegistry registry, int device, long bytes) {
    long ptr = Cuda.malloc(bytes);
    try {
      Cuda.memset(ptr, 0, bytes);
      // The region frees the memory once no transfer uses it any more.
      return registry.registerExternal(ptr, bytes, RegionKind.CUDA, device, () -> {
        Cuda.setDevice(device);
        Cuda.free(ptr);
      });
    } catch (RuntimeException e) {
      Cuda.free(ptr);
      throw e;
    }
  }

  @Override
  public List<MemoryRegion> layerRegions(int rank) {
    return layersByRank.get(rank);
  }

  @Override
  public void start(ActorSystem<?> system, ConnectorScheduler scheduler, List<ConnectorWorker> workers) {}

  @Override
  public void stop() {}

  @Override
  public void close() {}
}
