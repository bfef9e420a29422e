package dev.kvferry.actors.connector;

import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assumptions.assumeTrue;

import dev.kvferry.rdma.cuda.Cuda;
import dev.kvferry.rdma.cuda.CudaEvent;
import dev.kvferry.rdma.cuda.CudaStream;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.Test;

class CudaLayerEventTest {

  @Test
  void firesTheWritersCallbackOnceTheComputeStreamPassesTheEvent() throws Exception {
    assumeTrue(Cuda.available(), () -> "CUDA not available: " + Cuda.unavailableReason());
    Cuda.setDevice(0);
    long buffer = Cuda.malloc(64L << 20);
    try (CudaStream compute = CudaStream.create(0); CudaEvent event = CudaEvent.create(0, false)) {
      Cuda.memsetAsync(buffer, 1, 64L << 20, compute.handle());
      event.record(compute);
      CudaLayerEvent layer = new CudaLayerEvent(event);
      CountDownLatch fired = new CountDownLatch(1);
      layer.whenComplete(fired::countDown);
      assertTrue(fired.await(10, TimeUnit.SECONDS));
      assertTrue(layer.isComplete());
    } finally {
      Cuda.free(buffer);
    }
  }
}
