package dev.kvferry.sim;

import static org.junit.jupiter.api.Assumptions.assumeTrue;

import com.sun.jna.Memory;
import com.sun.jna.Pointer;
import dev.kvferry.actors.plan.KvCacheGeometry;
import dev.kvferry.rdma.CudaTransport;
import dev.kvferry.rdma.MemoryRegion;
import dev.kvferry.rdma.RegionRegistry;
import dev.kvferry.rdma.Transport;
import dev.kvferry.rdma.cuda.Cuda;
import java.util.Collections;
import org.junit.jupiter.api.BeforeEach;

/**
 * Every case of {@link SimulatedEngineTest} with both caches on GPU 0: P fills each layer with
 * the fill kernel on its compute stream and hands the connector the layer's CUDA event, the cuda
 * transport moves the blocks (one process: no IPC), D checks them with the verify kernel. Skipped
 * without CUDA.
 */
class GpuSimulatedEngineTest extends SimulatedEngineTest {

  @BeforeEach
  void requireCuda() {
    assumeTrue(Cuda.available(), () -> "CUDA not available: " + Cuda.unavailableReason());
  }

  @Override
  Transport transport(RegionRegistry prefill, RegionRegistry decode) {
    return new CudaTransport();
  }

  @Override
  SimKvCache cache(KvCacheGeometry g, int tp, RegionRegistry registry) {
    return new GpuKvCache(0, g, LAYERS, Collections.nCopies(tp, registry));
  }

  @Override
  void flipByte(MemoryRegion region, long offset) {
    try (Memory b = new Memory(1)) {
      Cuda.setDevice(region.device());
      Cuda.memcpy(Pointer.nativeValue(b), region.address() + offset, 1);
      b.setByte(0, (byte) (b.getByte(0) ^ 0x40));
      Cuda.memcpy(region.address() + offset, Pointer.nativeValue(b), 1);
    }
  }
}
