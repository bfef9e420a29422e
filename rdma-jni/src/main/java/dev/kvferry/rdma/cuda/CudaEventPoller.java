package dev.kvferry.rdma.cuda;

import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.locks.LockSupport;
import java.util.function.Consumer;
import org.jspecify.annotations.Nullable;

/**
 * One daemon thread that learns when CUDA events complete by polling {@code cudaEventQuery}, and
 * then runs the callback the watcher gave: no thread blocks per event. Events recorded on one
 * stream complete in record order, so for {@link #watchInOrder} watches only the oldest pending
 * event of each stream is queried: a sweep costs one query per busy stream, not one per event
 * (32 layers in flight made a sweep ~30 queries long, delaying the last layer's completion).
 * While events are pending the thread spins, up to {@link #SPIN_NS} after the last completion or
 * watch, then backs off to short parks (Aeron's backoff idea); idle, it parks until the next
 * watch. A completion is thus seen within about a microsecond while transfers flow, at the price
 * of one busy core while they do.
 */
public final class CudaEventPoller implements AutoCloseable {

  /** How long the thread spins without news before it parks between sweeps. */
  static final long SPIN_NS =
      Long.getLong("kvferry.cuda.poller.spin-us", 2_000) * 1_000;
  private static final long PARK_NS = 20_000;
  private static final long UNORDERED = 0;

  private static volatile @Nullable CudaEventPoller common;

  private record Watch(long order, long event, Runnable onComplete, Consumer<CudaException> onError) {}

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
    add(new Watch(UNORDERED, event, onComplete, onError));
  }

  public void watch(CudaEvent event, Runnable onComplete, Consumer<CudaException> onError) {
    watch(event.handle(), onComplete, onError);
  }

  /**
   * Like {@link #watch}, for an event just recorded on {@code stream}: the caller watches the
   * events of one stream in the order it recorded them (under one lock), and each is queried only
   * once all earlier ones of the stream have completed.
   */
  public void watchInOrder(
      long stream, long event, Runnable onComplete, Consumer<CudaException> onError) {
    add(new Watch(stream == UNORDERED ? -1 : stream, event, onComplete, onError));
  }

  private void add(Watch w) {
    incoming.add(w);
    LockSupport.unpark(thread);
  }

  private void run() {
    Map<Long, ArrayDeque<Watch>> byStream = new HashMap<>();
    List<Watch> unordered = new ArrayList<>();
    int pendingCount = 0;
    long lastNews = System.nanoTime();
    while (running) {
      Watch w;
      while ((w = incoming.poll()) != null) {
        if (w.order() == UNORDERED) {
          unordered.add(w);
        } else {
          byStream.computeIfAbsent(w.order(), k -> new ArrayDeque<>()).add(w);
        }
        pendingCount++;
        lastNews = System.nanoTime();
      }
      if (pendingCount == 0) {
        LockSupport.park(this);
        lastNews = System.nanoTime();
        continue;
      }
      int completed = 0;
      for (ArrayDeque<Watch> q : byStream.values()) {
        Watch head;
        while ((head = q.peek()) != null && poll(head)) {
          q.poll();
          completed++;
        }
      }
      for (int i = unordered.size() - 1; i >= 0; i--) {
        if (poll(unordered.get(i))) {
          unordered.remove(i);
          completed++;
        }
      }
      if (completed > 0) {
        pendingCount -= completed;
        lastNews = System.nanoTime();
      } else if (System.nanoTime() - lastNews < SPIN_NS) {
        Thread.onSpinWait();
      } else {
        LockSupport.parkNanos(this, PARK_NS);
      }
    }
  }

  /** True when {@code w} is finished with (its callback has run). */
  private static boolean poll(Watch w) {
    boolean done;
    try {
      done = Cuda.eventQuery(w.event());
    } catch (CudaException e) {
      safely(() -> w.onError().accept(e));
      return true;
    }
    if (done) {
      safely(w.onComplete());
    }
    return done;
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
