package dev.kvferry.rdma;

import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.List;
import java.util.Set;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.locks.Condition;
import java.util.concurrent.locks.ReentrantLock;

/**
 * The few daemon threads a transport runs its transfers on, so {@code write}/{@code read} return a
 * pending status at once. Closing fails the transfers that have not started.
 *
 * <p>The next transfer goes to the thread that went idle last, not the one idle longest (a {@link
 * java.util.concurrent.ThreadPoolExecutor} over a queue wakes its waiting threads in turn): one
 * transfer after another then keeps running on one thread, whose core's caches and TLB still hold
 * the regions (docs/performance.md has the A/B).
 */
final class TransferExecutor {

  /** Idle threads end after this long; the next transfer starts one again. */
  private static final long KEEP_ALIVE_NANOS = TimeUnit.SECONDS.toNanos(30);

  /**
   * A queued transfer: its work, the status to fail if it never runs, and what to release (pins)
   * whether it runs or not.
   */
  private record Job(TransferStatus status, Runnable work, Runnable release, String transport)
      implements Runnable {
    @Override
    public void run() {
      try {
        work.run();
      } catch (RuntimeException | Error e) {
        // A bug, but the caller must still see a terminal status rather than wait forever.
        status.fail(transport + " transfer failed unexpectedly: " + e);
      } finally {
        release.run();
      }
    }
  }

  /** One thread; {@code wake} is signalled when a job is handed to it while it is idle. */
  private final class Worker implements Runnable {
    final Condition wake = lock.newCondition();
    final Thread thread;

    Worker(String name) {
      thread = new Thread(this, name);
      thread.setDaemon(true);
    }

    @Override
    public void run() {
      lock.lock();
      try {
        while (true) {
          Job job = jobs.pollFirst();
          if (job != null) {
            lock.unlock();
            try {
              job.run();
            } finally {
              lock.lock();
            }
            continue;
          }
          if (closed) {
            return;
          }
          idle.addFirst(this); // the top of the stack: the next job comes here
          long left = wake.awaitNanos(KEEP_ALIVE_NANOS);
          if (idle.remove(this) && left <= 0 && jobs.isEmpty()) {
            return; // timed out while nobody handed it anything
          }
        }
      } catch (InterruptedException e) {
        // close(): end like a closed pool's thread
      } finally {
        idle.remove(this);
        running.remove(this);
        lock.unlock();
      }
    }
  }

  private final String transport;
  private final int maxThreads;
  private final ReentrantLock lock = new ReentrantLock();
  private final ArrayDeque<Job> jobs = new ArrayDeque<>();
  /** Idle workers, the most recently idle first. */
  private final ArrayDeque<Worker> idle = new ArrayDeque<>();
  private final Set<Worker> running = new HashSet<>();
  private int started;
  private boolean closed;

  TransferExecutor(String transport, int threads) {
    if (threads < 1) {
      throw new IllegalArgumentException(transport + ": at least one transfer thread, got " + threads);
    }
    this.transport = transport;
    this.maxThreads = threads;
  }

  /**
   * Runs {@code work}, which must complete {@code status}, then {@code release}. When the
   * executor is closed, fails {@code status} and runs only {@code release}.
   */
  void submit(TransferStatus status, Runnable work, Runnable release) {
    Job job = new Job(status, work, release, transport);
    lock.lock();
    try {
      if (!closed) {
        jobs.addLast(job);
        Worker w = idle.pollFirst();
        if (w != null) {
          w.wake.signal();
        } else if (running.size() < maxThreads) {
          start();
        } // else a busy worker takes it next
        return;
      }
    } finally {
      lock.unlock();
    }
    status.fail(transport + " transport is closed");
    release.run();
  }

  /** Threads alive now (tests). */
  int threads() {
    lock.lock();
    try {
      return running.size();
    } finally {
      lock.unlock();
    }
  }

  /** Threads waiting for a transfer now (tests). */
  int idleThreads() {
    lock.lock();
    try {
      return idle.size();
    } finally {
      lock.unlock();
    }
  }

  private void start() {
    Worker w = new Worker("kvferry-" + transport + "-io-" + (++started));
    running.add(w);
    w.thread.start();
  }

  /** Fails the transfers not started; interrupts the running ones' threads, as a pool's shutdownNow. */
  void close() {
    List<Job> neverRan;
    lock.lock();
    try {
      if (closed) {
        return;
      }
      closed = true;
      neverRan = new ArrayList<>(jobs);
      jobs.clear();
      for (Worker w : running) {
        w.thread.interrupt();
      }
    } finally {
      lock.unlock();
    }
    for (Job job : neverRan) {
      job.status().fail(transport + " transport closed before the transfer started");
      job.release().run();
    }
  }
}
