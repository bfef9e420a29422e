package dev.kvferry.rdma;

import java.util.List;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.RejectedExecutionException;
import java.util.concurrent.ThreadPoolExecutor;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;

/**
 * The few daemon threads a transport runs its transfers on, so {@code write}/{@code read} return a
 * pending status at once. Closing fails the transfers that have not started.
 */
final class TransferExecutor {

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
        throw e;
      } finally {
        release.run();
      }
    }
  }

  private final String transport;
  private final ThreadPoolExecutor pool;

  TransferExecutor(String transport, int threads) {
    this.transport = transport;
    AtomicInteger n = new AtomicInteger();
    this.pool =
        new ThreadPoolExecutor(
            threads,
            threads,
            30,
            TimeUnit.SECONDS,
            new LinkedBlockingQueue<>(),
            r -> {
              Thread t = new Thread(r, "kvferry-" + transport + "-io-" + n.incrementAndGet());
              t.setDaemon(true);
              return t;
            });
    pool.allowCoreThreadTimeOut(true);
  }

  /**
   * Runs {@code work}, which must complete {@code status}, then {@code release}. When the
   * executor is closed, fails {@code status} and runs only {@code release}.
   */
  void submit(TransferStatus status, Runnable work, Runnable release) {
    try {
      pool.execute(new Job(status, work, release, transport));
    } catch (RejectedExecutionException e) {
      status.fail(transport + " transport is closed");
      release.run();
    }
  }

  void close() {
    List<Runnable> neverRan = pool.shutdownNow();
    for (Runnable r : neverRan) {
      if (r instanceof Job job) {
        job.status().fail(transport + " transport closed before the transfer started");
        job.release().run();
      }
    }
  }
}
