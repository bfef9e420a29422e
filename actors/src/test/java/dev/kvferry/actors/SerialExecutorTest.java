package dev.kvferry.actors;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.RejectedExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import org.junit.jupiter.api.Test;

/**
 * The strand that queues P's GPU-ordered layer submissions: on a pool of many threads it must run
 * tasks one at a time and in the order given (a copy stream runs what it is handed in order).
 */
class SerialExecutorTest {

  @Test
  void tasksRunOneAtATimeInTheOrderGivenOnAPoolOfManyThreads() throws Exception {
    ExecutorService pool = Executors.newFixedThreadPool(8);
    try {
      SerialExecutor strand = new SerialExecutor(pool);
      int n = 20_000;
      List<Integer> ran = Collections.synchronizedList(new ArrayList<>(n));
      AtomicInteger running = new AtomicInteger();
      AtomicInteger overlaps = new AtomicInteger();
      CountDownLatch done = new CountDownLatch(n);
      // Several submitters, each with its own increasing sequence: each sequence must come out
      // in order, and no two tasks may overlap.
      int submitters = 4;
      Thread[] threads = new Thread[submitters];
      for (int s = 0; s < submitters; s++) {
        int base = s * (n / submitters);
        threads[s] = new Thread(() -> {
          for (int i = 0; i < n / submitters; i++) {
            int id = base + i;
            strand.execute(() -> {
              if (running.incrementAndGet() != 1) {
                overlaps.incrementAndGet();
              }
              ran.add(id);
              running.decrementAndGet();
              done.countDown();
            });
          }
        });
        threads[s].start();
      }
      for (Thread t : threads) {
        t.join();
      }
      assertTrue(done.await(60, TimeUnit.SECONDS), "every task ran");
      assertEquals(0, overlaps.get(), "tasks overlapped");
      assertEquals(n, ran.size());
      int[] last = new int[submitters];
      java.util.Arrays.fill(last, -1);
      for (int id : ran) {
        int s = id / (n / submitters);
        assertTrue(id > last[s], "task " + id + " ran after " + last[s] + " of the same submitter");
        last[s] = id;
      }
    } finally {
      pool.shutdownNow();
    }
  }

  @Test
  void aBurstGivenWhileOneRunsIsRunByTheSameThreadAfterIt() throws Exception {
    ExecutorService pool = Executors.newFixedThreadPool(4);
    try {
      SerialExecutor strand = new SerialExecutor(pool);
      CountDownLatch firstStarted = new CountDownLatch(1);
      CountDownLatch release = new CountDownLatch(1);
      List<String> threads = Collections.synchronizedList(new ArrayList<>());
      CountDownLatch done = new CountDownLatch(6);
      strand.execute(() -> {
        threads.add(Thread.currentThread().getName());
        firstStarted.countDown();
        try {
          release.await();
        } catch (InterruptedException e) {
          Thread.currentThread().interrupt();
        }
        done.countDown();
      });
      assertTrue(firstStarted.await(10, TimeUnit.SECONDS));
      for (int i = 0; i < 5; i++) {
        strand.execute(() -> {
          threads.add(Thread.currentThread().getName());
          done.countDown();
        });
      }
      release.countDown();
      assertTrue(done.await(10, TimeUnit.SECONDS));
      assertEquals(1, threads.stream().distinct().count(), "one hand-off for the burst: " + threads);
    } finally {
      pool.shutdownNow();
    }
  }

  @Test
  void aRefusedTaskIsReportedNeverRunsAndTheStrandStaysUsable() throws Exception {
    ExecutorService pool = Executors.newSingleThreadExecutor();
    AtomicInteger refusals = new AtomicInteger(1);
    SerialExecutor strand = new SerialExecutor(task -> {
      if (refusals.getAndDecrement() > 0) {
        throw new RejectedExecutionException("shut down");
      }
      pool.execute(task);
    });
    try {
      AtomicInteger ran = new AtomicInteger();
      assertThrows(RejectedExecutionException.class, () -> strand.execute(ran::incrementAndGet));
      CountDownLatch done = new CountDownLatch(1);
      strand.execute(done::countDown);
      assertTrue(done.await(10, TimeUnit.SECONDS), "the strand was left stuck after a refusal");
      assertEquals(0, ran.get(), "the refused task ran after all");
    } finally {
      pool.shutdownNow();
    }
  }
}
