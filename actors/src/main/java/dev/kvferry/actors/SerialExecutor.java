package dev.kvferry.actors;

import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.Executor;
import java.util.concurrent.RejectedExecutionException;
import java.util.concurrent.atomic.AtomicBoolean;

/**
 * Runs its tasks one at a time, in the order they were given, on threads of another executor: a
 * strand. The tasks queued while one runs are run by the same thread after it, so a burst costs
 * one hand-off, not one per task.
 */
final class SerialExecutor implements Executor {
  private final Executor under;
  private final ConcurrentLinkedQueue<Runnable> tasks = new ConcurrentLinkedQueue<>();
  private final AtomicBoolean scheduled = new AtomicBoolean();

  SerialExecutor(Executor under) {
    this.under = under;
  }

  /**
   * @throws RejectedExecutionException when the executor underneath refuses to run the queue (it
   *     was shut down): {@code task} is taken back and never runs; the strand stays usable
   */
  @Override
  public void execute(Runnable task) {
    tasks.add(task);
    try {
      schedule();
    } catch (RejectedExecutionException e) {
      tasks.remove(task);
      throw e;
    }
  }

  private void schedule() {
    if (scheduled.compareAndSet(false, true)) {
      try {
        under.execute(this::drain);
      } catch (RejectedExecutionException e) {
        scheduled.set(false);
        throw e;
      }
    }
  }

  private void drain() {
    try {
      for (Runnable task; (task = tasks.poll()) != null; ) {
        task.run(); // CompletableFuture's tasks catch their own exceptions
      }
    } finally {
      scheduled.set(false);
      if (!tasks.isEmpty()) {
        schedule(); // added after our last poll, before the flag was cleared
      }
    }
  }
}
