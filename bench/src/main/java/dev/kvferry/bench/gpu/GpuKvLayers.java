package dev.kvferry.bench.gpu;

import com.sun.jna.Memory;
import dev.kvferry.rdma.MemoryRegion;
import dev.kvferry.rdma.RegionKind;
import dev.kvferry.rdma.RegionRegistry;
import dev.kvferry.rdma.cuda.Cuda;
import java.util.ArrayList;
import java.util.List;

/**
 * One engine's KV cache on a GPU, laid out as vLLM does for a Llama-like model: one allocation per
 * layer holding all K blocks then all V blocks ({@code [2, capacity, blockBytes]}), each layer
 * registered as a CUDA region.
 */
public final class GpuKvLayers implements AutoCloseable {
  public final int device;
  public final int layers;
  public final int capacityBlocks;
  public final long blockBytes;
  public final List<MemoryRegion> regions = new ArrayList<>();
  private final long[] allocations;

  public GpuKvLayers(RegionRegistry registry, int device, int layers, int capacityBlocks, long blockBytes) {
    this.device = device;
    this.layers = layers;
    this.capacityBlocks = capacityBlocks;
    this.blockBytes = blockBytes;
    this.allocations = new long[layers];
    Cuda.setDevice(device);
    for (int l = 0; l < layers; l++) {
      allocations[l] = Cuda.malloc(layerBytes());
      Cuda.memset(allocations[l], 0, layerBytes());
      regions.add(registry.registerExternal(allocations[l], layerBytes(), RegionKind.CUDA, device));
    }
  }

  long layerBytes() {
    return 2L * capacityBlocks * blockBytes;
  }

  public void clear() {
    Cuda.setDevice(device);
    for (long a : allocations) {
      Cuda.memset(a, 0, layerBytes());
    }
  }

  /**
   * Offsets within a layer of the 2n blocks of a request, in logical order: K of each block id,
   * then V of each.
   */
  public long[] slotOffsets(int[] blockIds) {
    long[] offsets = new long[2 * blockIds.length];
    for (int i = 0; i < blockIds.length; i++) {
      offsets[i] = (long) blockIds[i] * blockBytes;
      offsets[blockIds.length + i] = ((long) capacityBlocks + blockIds[i]) * blockBytes;
    }
    return offsets;
  }

  /** The offsets uploaded to this device (free with {@link Cuda#free}). */
  public long upload(long[] values) {
    Cuda.setDevice(device);
    long dev = Cuda.malloc(8L * values.length);
    Memory host = new Memory(8L * values.length);
    host.write(0, values, 0, values.length);
    Cuda.memcpy(dev, com.sun.jna.Pointer.nativeValue(host), 8L * values.length);
    host.close();
    return dev;
  }

  @Override
  public void close() {
    Cuda.setDevice(device);
    for (MemoryRegion r : regions) {
      r.close();
    }
    for (long a : allocations) {
      Cuda.free(a);
    }
  }
}
