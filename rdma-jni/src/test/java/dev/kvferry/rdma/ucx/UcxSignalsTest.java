package dev.kvferry.rdma.ucx;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assumptions.assumeTrue;

import dev.kvferry.rdma.testing.ChildJvm;
import java.time.Duration;
import java.util.List;
import org.junit.jupiter.api.Test;

/**
 * Loading UCX into a JVM whose threads are faulting on purpose must not abort it. libucs installs
 * its own SIGSEGV handler when it loads; a JVM thread that hit a safepoint poll page in that window
 * was caught by UCX's handler, which aborts. The child ({@link LoadUnderSafepoints}) keeps a
 * compiled loop running and safepoints coming while it loads UCX, as a node or a bench peer does
 * at start while other threads are busy; before the fix it died in every run.
 */
class UcxSignalsTest {
  private static final Duration REPLY = Duration.ofSeconds(60);

  @Test
  void loadingUcxWhileJvmThreadsFaultOnSafepointPollsLeavesTheJvmAlive() throws Exception {
    assumeTrue(Ucx.available(), () -> "UCX not available: " + Ucx.unavailableReason());
    for (int run = 0; run < 2; run++) {
      try (ChildJvm child =
          ChildJvm.start(LoadUnderSafepoints.class.getName(), List.of("-Xmx64m"), List.of())) {
        assertEquals("true", child.awaitLine("UCX ", REPLY), child::stderrTail);
        assertEquals("", child.awaitLine("ALIVE", REPLY), child::stderrTail);
        assertEquals(0, child.awaitExit(REPLY).orElseThrow(), child::stderrTail);
      }
    }
  }

  /** Spins until {@code count} reaches {@code at}: progress of the child's threads, not time. */
  private static void awaitAtLeast(java.util.function.LongSupplier count, long at) {
    while (count.getAsLong() < at) {
      Thread.onSpinWait();
    }
  }

  /** The child: a hot loop, a storm of safepoints, then UCX's first use. */
  public static final class LoadUnderSafepoints {
    private static volatile long sink;
    private static volatile long loops;
    private static volatile long safepoints;

    public static void main(String[] args) throws Exception {
      Thread hot = new Thread(() -> {
        long x = 0;
        while (true) {
          for (int i = 0; i < 1_000_000; i++) {
            x += i ^ (x >>> 3);
          }
          sink = x;
          loops++;
        }
      }, "hot-loop");
      Thread storm = new Thread(() -> {
        while (true) {
          Thread.getAllStackTraces(); // each call is a safepoint: the hot loop faults on its poll
          safepoints++;
        }
      }, "safepoint-storm");
      hot.setDaemon(true);
      storm.setDaemon(true);
      hot.start();
      storm.start();
      awaitAtLeast(() -> loops, 200); // the loop has run long enough to be compiled, with its poll
      System.out.println("UCX " + Ucx.available());
      long after = safepoints;
      awaitAtLeast(() -> safepoints, after + 1000); // faults after the load, under its handlers
      System.out.println("ALIVE");
    }
  }
}
