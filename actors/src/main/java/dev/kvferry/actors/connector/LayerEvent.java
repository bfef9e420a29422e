package dev.kvferry.actors.connector;

/**
 * Signals that one layer's KV has been computed (a CUDA event on GPU engines). The writer never
 * blocks on it: it registers a callback and is told when the event fires.
 */
public interface LayerEvent {

  /** True once the layer's KV is complete. */
  boolean isComplete();

  /**
   * Runs {@code callback} once the event fires (at once if it already has), on any thread. The
   * callback must be cheap: it only sends a message.
   */
  void whenComplete(Runnable callback);
}
