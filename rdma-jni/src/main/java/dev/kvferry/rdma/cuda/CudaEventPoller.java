package dev.kvferry.rdma.cuda;

import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.locks.LockSupport;
import java.util.function.Consumer;

/**
 * One daemon thread that learns when CUDA events complete by polling {@code cudaEventQuery}, and
 * then runs the callback the watcher gave: no thread blocks per event. While events are pending it
 * spins briefly, then backs off to short parks (Aeron's backoff idea), so a completion is seen
 * within microseconds without burning a core when nothing is in flight; idle, it parks until the
 * next watch.
 */
public final class CudaEventPoller implements AutoCloseable {

  private static final int SPINS_BEFORE_PARK = 2_000;
  private static final long PARK_NS = 20_000;

  private static volatile CudaEventPoller common;

  private record Watch(long event, Runnable onComplete, Consumer<CudaException> onError) {}

  private final ConcurrentLinkedQueue<Watch> incoming = new ConcurrentLinkedQueue<>();
  private final Thread thread;
  private volatile boolean running = true;

  public CudaEventPoller(String name) {
    thread = new Thread(this::run, name);
    thread.setDaemon(true);
    thread.start();
  }

  /** The process-wide poller, started on first use. */
  public static CudaEventPoller common() {
    CudaEventPoller p = common;
    if (p == null) {
      synchronized (CudaEventPoller.class) {
        p = common;
        if (p == null) {
          Cuda.require();
          p = new CudaEventPoller("kvferry-cuda-event-poller");
          common = p;
        }
      }
    }
    return p;
  }

  /**
   * Runs {@code onComplete} on the poller thread once {@code event} (its last record) completes, or
   * {@code onError} if querying it fails. Callbacks must be short: they complete a status or send
   * a message.
   */
  public void watch(long event, Runnable onComplete, Consumer<CudaException> onError) {
    incoming.add(new Watch(event, onComplete, onError));
    LockSupport.unpark(thread);
  }

  public void watch(CudaEvent event, Runnable onComplete, Consumer<CudaException> onError) {
    watch(event.handle(), onComplete, onError);
  }

  private void run() {
    List<Watch> pending = new ArrayList<>();
    int idleSpins = 0;
    while (running) {
      Watch w;
      while ((w = incoming.poll()) != null) {
        pending.add(w);
      }
      if (pending.isEmpty()) {
        LockSupport.park(this);
        continue;
      }
      boolean progress = false;
      for (int i = pending.size() - 1; i >= 0; i--) {
        Watch p = pending.get(i);
        boolean done;
        try {
          done = Cuda.eventQuery(p.event());
        } catch (CudaException e) {
          pending.remove(i);
          progress = true;
          safely(() -> p.onError().accept(e));
          continue;
        }
        if (done) {
          pending.remove(i);
          progress = true;
          safely(p.onComplete());
        }
      }
      if (progress) {
        idleSpins = 0;
      } else if (++idleSpins < SPINS_BEFORE_PARK) {
        Thread.onSpinWait();
      } else {
        LockSupport.parkNanos(this, PARK_NS);
      }
    }
  }

  private static void safely(Runnable r) {
    try {
      r.run();
    } catch (RuntimeException e) {
      // A watcher's bug must not stop completions for everyone else.
      Thread t = Thread.currentThread();
      t.getUncaughtExceptionHandler().uncaughtException(t, e);
    }
  }

  @Override
  public void close() {
    running = false;
    LockSupport.unpark(thread);
  }
}
