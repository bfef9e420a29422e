package dev.kvferry.actors.connector;

import java.util.concurrent.CompletableFuture;

/** A layer event for engines that compute on the CPU: fired by the engine once a layer is filled. */
public final class HostLayerEvent implements LayerEvent {

  private final CompletableFuture<Void> fired = new CompletableFuture<>();

  /** An event that has already fired. */
  public static HostLayerEvent completed() {
    HostLayerEvent e = new HostLayerEvent();
    e.fire();
    return e;
  }

  public void fire() {
    fired.complete(null);
  }

  @Override
  public boolean isComplete() {
    return fired.isDone();
  }

  @Override
  public void whenComplete(Runnable callback) {
    fired.thenRun(callback);
  }
}
