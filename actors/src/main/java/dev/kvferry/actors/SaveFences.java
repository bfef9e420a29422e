package dev.kvferry.actors;

import java.util.ArrayList;
import java.util.HashSet;
import java.util.Iterator;
import java.util.List;
import java.util.Set;
import java.util.concurrent.CompletableFuture;

/**
 * P, WRITE: the engine's waits for no copy to read a preempted request's blocks any more (vLLM's
 * {@code handle_preemptions}: the engine reuses a preempted request's blocks right after it, with
 * no delayed free). Each wait completes once every transfer it names has ended here, written or
 * failed with its copies drained. Used on the writer's thread only.
 */
final class SaveFences {

  private record Fence(Set<String> transferIds, CompletableFuture<Void> done) {}

  private final List<Fence> waiting = new ArrayList<>();

  /** Completes {@code done} once none of {@code transferIds} is live; at once if none is. */
  void await(Set<String> transferIds, CompletableFuture<Void> done) {
    if (transferIds.isEmpty()) {
      done.complete(null);
      return;
    }
    waiting.add(new Fence(new HashSet<>(transferIds), done));
  }

  /** A transfer's job ended: no copy of it reads the engine's blocks any more. */
  void ended(String transferId) {
    for (Iterator<Fence> it = waiting.iterator(); it.hasNext(); ) {
      Fence f = it.next();
      if (f.transferIds().remove(transferId) && f.transferIds().isEmpty()) {
        it.remove();
        f.done().complete(null);
      }
    }
  }

  /** The writer stopped: its waits end in an error (the engine is detaching). */
  void failAll(String why) {
    waiting.forEach(f -> f.done().completeExceptionally(new IllegalStateException(why)));
    waiting.clear();
  }
}
