package dev.kvferry.actors;

import dev.kvferry.rdma.MemoryRegion;
import dev.kvferry.rdma.RegionDescriptor;
import dev.kvferry.rdma.TransferBatch;
import dev.kvferry.rdma.TransferStatus;
import dev.kvferry.rdma.Transport;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.Executor;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.function.IntConsumer;

/**
 * Hands one transfer's layer reads to the transport (D, READ). Host copies block until their
 * bytes moved: one task per layer on the blocking pool, in parallel. A transport that orders
 * copies on the GPU only queues them (a launch and an event record, tens of microseconds): the
 * caller queues every layer itself, in layer order, so the engine's wait for layer 0 is answered
 * first and no pool thread has to wake before it (that hand-off took 104-124 us of a READ's start
 * on the GPU, docs/gpu.md); each queued layer is told to {@code onQueued}.
 */
final class LayerReadIssue {

  private LayerReadIssue() {}

  /**
   * Starts the reads of every layer from {@code peerLayers} into {@code localLayers}; returns,
   * per layer, the read's status once the transport has it (a read that throws fails its layer).
   * A read not started yet when {@code cancelled} is set is skipped (failed). With {@code
   * gpuOrdered} every layer is queued before this returns.
   */
  static List<CompletableFuture<TransferStatus>> start(Transport transport, Executor io,
      boolean gpuOrdered, List<MemoryRegion> localLayers, List<RegionDescriptor> peerLayers,
      TransferBatch plan, AtomicBoolean cancelled, String transferId, IntConsumer onQueued) {
    int layers = localLayers.size();
    List<CompletableFuture<TransferStatus>> issued = new ArrayList<>(layers);
    for (int layer = 0; layer < layers; layer++) {
      issued.add(new CompletableFuture<>());
    }
    IntConsumer readLayer = l -> {
      try {
        if (l == 0) {
          ReadStamps.mark(transferId, ReadStamps.Stage.IO_STARTED);
        }
        if (cancelled.get()) {
          issued.get(l).complete(TransferStatus.failed("transfer ended before this layer was read"));
          return;
        }
        TransferStatus s = transport.read(localLayers.get(l), peerLayers.get(l), plan);
        if (l == 0) {
          ReadStamps.markLayer0Returned(transferId);
        }
        if (gpuOrdered && s.state() != TransferStatus.State.FAILED) {
          onQueued.accept(l);
        }
        if (l == 0 || l == layers - 1) {
          ReadStamps.mark(transferId,
              l == layers - 1 ? ReadStamps.Stage.LAST_QUEUED : ReadStamps.Stage.LAYER0_QUEUED);
        }
        issued.get(l).complete(s);
      } catch (Throwable e) { // as supplyAsync did: the layer's read fails, nothing hangs
        issued.get(l).completeExceptionally(e);
      }
    };
    if (gpuOrdered) {
      for (int l = 0; l < layers; l++) {
        readLayer.accept(l);
      }
    } else {
      for (int layer = 0; layer < layers; layer++) {
        int l = layer;
        io.execute(() -> readLayer.accept(l));
      }
    }
    return issued;
  }
}
