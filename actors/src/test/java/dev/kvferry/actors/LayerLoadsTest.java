package dev.kvferry.actors;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvferry.rdma.MemoryRegion;
import dev.kvferry.rdma.RegionRegistry;
import java.util.List;
import java.util.Optional;
import java.util.Set;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;

/** D, READ: when a layer's reads count as queued (the event path) and as landed (the CPU wait). */
class LayerLoadsTest {

  private static final long SHORT_NS = TimeUnit.MILLISECONDS.toNanos(20);
  private final RegionRegistry local = new RegionRegistry("d");
  private final RegionRegistry peerA = new RegionRegistry("p-rank0");
  private final RegionRegistry peerB = new RegionRegistry("p-rank1");
  private final MemoryRegion layer0 = local.allocateHost(64);
  private final LayerLoads loads = new LayerLoads();

  @AfterEach
  void close() {
    local.close();
    peerA.close();
    peerB.close();
  }

  private LayerLoads.QueuedRead readFrom(RegionRegistry peer) {
    return new LayerLoads.QueuedRead(layer0, peer.allocateHost(64).descriptor());
  }

  @Test
  void aLayerIsQueuedOnlyOnceTheReadOfEverySourceIs() throws Exception {
    loads.begin("t");
    loads.readsPerLayer("t", 2);
    LayerLoads.QueuedRead a = readFrom(peerA);
    loads.readQueued("t", 0, a);
    assertEquals(Optional.empty(), loads.awaitQueued(Set.of("t"), 0, SHORT_NS));

    LayerLoads.QueuedRead b = readFrom(peerB);
    loads.readQueued("t", 0, b);
    assertEquals(Optional.of(List.of(a, b)), loads.awaitQueued(Set.of("t"), 0, SHORT_NS));
    // Queued is not landed: the CPU wait still waits for the copies.
    assertFalse(loads.await(Set.of("t"), 0, SHORT_NS));
  }

  @Test
  void readsQueuedBeforeTheReaderKnowsItsSourcesDoNotCountYet() throws Exception {
    loads.begin("t");
    LayerLoads.QueuedRead a = readFrom(peerA);
    loads.readQueued("t", 1, a);
    assertEquals(Optional.empty(), loads.awaitQueued(Set.of("t"), 1, SHORT_NS));
    loads.readsPerLayer("t", 1);
    assertEquals(Optional.of(List.of(a)), loads.awaitQueued(Set.of("t"), 1, SHORT_NS));
  }

  @Test
  void landedLayersAndEndedTransfersLeaveNothingToWaitForOnTheGpu() throws Exception {
    loads.begin("landed");
    loads.readsPerLayer("landed", 1);
    loads.readQueued("landed", 0, readFrom(peerA));
    loads.layerLanded("landed", 0);
    loads.begin("failed");
    loads.readsPerLayer("failed", 1);
    loads.readQueued("failed", 0, readFrom(peerB));
    loads.ended("failed");

    assertEquals(Optional.of(List.of()),
        loads.awaitQueued(Set.of("landed", "failed"), 0, SHORT_NS));
    assertTrue(loads.await(Set.of("landed", "failed"), 0, SHORT_NS));
  }

  @Test
  void oneTransferNotQueuedHoldsTheLayerForAll() throws Exception {
    loads.begin("ready");
    loads.readsPerLayer("ready", 1);
    loads.readQueued("ready", 0, readFrom(peerA));
    loads.begin("waiting"); // its peer's metadata has not come yet

    assertEquals(Optional.empty(), loads.awaitQueued(Set.of("ready", "waiting"), 0, SHORT_NS));
    // Another layer's read does not count for this one.
    loads.readsPerLayer("waiting", 1);
    loads.readQueued("waiting", 2, readFrom(peerB));
    assertEquals(Optional.empty(), loads.awaitQueued(Set.of("ready", "waiting"), 0, SHORT_NS));
  }

  @Test
  void aWaiterWakesWhenTheLastReadIsQueuedOnAnotherThread() throws Exception {
    loads.begin("t");
    loads.readsPerLayer("t", 1);
    LayerLoads.QueuedRead a = readFrom(peerA);
    Thread io = new Thread(() -> loads.readQueued("t", 0, a));
    io.start();
    assertEquals(Optional.of(List.of(a)),
        loads.awaitQueued(Set.of("t"), 0, TimeUnit.SECONDS.toNanos(30)));
    io.join();
  }
}
