package dev.kvferry.actors.connector;

import dev.kvferry.rdma.cuda.CudaEvent;
import dev.kvferry.rdma.cuda.CudaEventPoller;

/**
 * A layer event of a GPU engine: the CUDA event the engine recorded on its compute stream after
 * the layer's KV was written. With the {@code cuda} transport the writer does not wait for it at
 * all: it queues the layer's copies behind it on the copy stream ({@code cudaStreamWaitEvent}).
 * Otherwise {@link #whenComplete} learns of it from the shared {@link CudaEventPoller}; no thread
 * blocks on the event either way.
 */
public final class CudaLayerEvent implements LayerEvent {

  private final CudaEvent event;

  public CudaLayerEvent(CudaEvent event) {
    this.event = java.util.Objects.requireNonNull(event, "event");
  }

  /** The CUDA event, for ordering copies behind it on the GPU. */
  public CudaEvent event() {
    return event;
  }

  @Override
  public boolean isComplete() {
    return event.isComplete();
  }

  /**
   * Runs {@code callback} on the poller thread once the event fires. If querying the event fails
   * (a sticky CUDA error), the callback runs too: the write that follows then fails with the
   * error's name, rather than the request waiting for its deadline.
   */
  @Override
  public void whenComplete(Runnable callback) {
    CudaEventPoller.common().watch(event, callback, e -> callback.run());
  }
}
