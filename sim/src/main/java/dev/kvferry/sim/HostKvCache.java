package dev.kvferry.sim;

import dev.kvferry.actors.connector.HostLayerEvent;
import dev.kvferry.actors.connector.LayerEvent;
import dev.kvferry.actors.plan.KvCacheGeometry;
import dev.kvferry.rdma.MemoryRegion;
import java.nio.ByteBuffer;
import java.util.ArrayList;
import java.util.List;
import org.jspecify.annotations.Nullable;

/**
 * The KV cache in host memory (the registered regions of each rank), computed and checked by the
 * engine's thread: every call has finished its work when it returns.
 */
public final class HostKvCache implements SimKvCache {

  private final KvCacheGeometry geometry;
  /** Per TP rank, its layers. */
  private final List<List<ByteBuffer>> rankLayers = new ArrayList<>();
  private final List<List<MemoryRegion>> regions;

  /**
   * @param geometry one rank's geometry
   * @param layerRegionsByRank per TP rank (in rank order), its layer regions (host, under 2 GiB)
   */
  public HostKvCache(KvCacheGeometry geometry, List<List<MemoryRegion>> layerRegionsByRank) {
    this.geometry = geometry;
    this.regions = layerRegionsByRank.stream().map(List::copyOf).toList();
    for (List<MemoryRegion> regions : layerRegionsByRank) {
      List<ByteBuffer> layers = new ArrayList<>();
      for (MemoryRegion r : regions) {
        if (r.lengthBytes() > Integer.MAX_VALUE) {
          throw new IllegalArgumentException("simulated engine needs layer regions under 2 GiB");
        }
        layers.add(KvPattern.view(r.buffer(0, (int) r.lengthBytes())));
      }
      rankLayers.add(layers);
    }
  }

  @Override
  public int ranks() {
    return rankLayers.size();
  }

  @Override
  public int layers() {
    return rankLayers.get(0).size();
  }

  @Override
  public List<MemoryRegion> layerRegions(int rank) {
    return regions.get(rank);
  }

  @Override
  public ForwardPass forward(List<TokenRange> ranges) {
    return new ForwardPass() {
      @Override
      public LayerEvent layer(int rank, int layer) {
        for (TokenRange r : ranges) {
          fill(rank, layer, r);
        }
        return HostLayerEvent.completed(); // the layer's KV is complete: its writes may start
      }

      @Override
      public Fence end() {
        return Fence.DONE;
      }
    };
  }

  @Override
  public void fill(TokenRange range) {
    for (int rank = 0; rank < ranks(); rank++) {
      for (int layer = 0; layer < layers(); layer++) {
        fill(rank, layer, range);
      }
    }
  }

  private void fill(int rank, int layer, TokenRange r) {
    KvPattern.fill(rankLayers.get(rank).get(layer), geometry, KvPattern.firstHead(geometry, rank),
        r.requestKey(), layer, r.blockIds(), r.fromToken(), r.toToken());
  }

  @Override
  public Check check(TokenRange r) {
    KvPattern.Mismatch bad = null;
    for (int rank = 0; rank < ranks() && bad == null; rank++) {
      for (int layer = 0; layer < layers() && bad == null; layer++) {
        bad = KvPattern.verify(rankLayers.get(rank).get(layer), geometry,
            KvPattern.firstHead(geometry, rank), r.requestKey(), layer, r.blockIds(),
            r.fromToken(), r.toToken());
        if (bad != null && ranks() > 1) {
          bad = bad.onRank(rank);
        }
      }
    }
    KvPattern.Mismatch found = bad;
    return new Check() {
      @Override
      public boolean isDone() {
        return true;
      }

      @Override
      public KvPattern.@Nullable Mismatch firstMismatch() {
        return found;
      }
    };
  }

  @Override
  public Fence fence() {
    return Fence.DONE;
  }

  /** The regions belong to their registries, which free them. */
  @Override
  public void close() {}
}
