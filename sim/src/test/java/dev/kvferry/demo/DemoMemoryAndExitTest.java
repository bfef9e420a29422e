package dev.kvferry.demo;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.List;
import java.util.Optional;
import org.junit.jupiter.api.Test;

/** The demo refuses a geometry that does not fit in memory, and says how a child process died. */
class DemoMemoryAndExitTest {

  private static final long GIB = 1L << 30;

  private static DemoOptions blocks(int p, int d) {
    return new DemoOptions("cma", List.of("write", "read"), 32, 8, 128, 16, 2, false, 576, p, d,
        48, 128, 2048, 0.1, 0.25, 8, 42, false);
  }

  @Test
  void aGeometryWhoseKvCachesDoNotFitInMemoryIsRefusedNamingNeedAndAvailable() {
    // The run: 3001 + 4999 blocks of 2 MiB (32 layers) in two modes on a 24 GiB host.
    DemoOptions o = blocks(3001, 4999);
    assertEquals(3001L * 65_536 * 32 * 2, o.hostKvCacheBytes(true)); // 2 MiB a block, 2 modes
    Optional<String> refusal = Demo.memoryRefusal(o, 24 * GIB);
    assertTrue(refusal.isPresent());
    String why = refusal.get();
    assertTrue(why.contains("only 24.00 GiB is available") && why.contains("--num-blocks-p"), why);
    assertTrue(why.contains("3001 blocks") && why.contains("4999 blocks"), why);
  }

  @Test
  void theDefaultGeometryFitsOnTheSameHostAndGpuCachesAreNotCountedAsHostMemory() {
    assertTrue(Demo.memoryRefusal(DemoOptions.defaults(), 24 * GIB).isEmpty());
    DemoOptions onGpus = blocks(3001, 4999).withGpus(0, 0);
    assertEquals(0, onGpus.hostKvCacheBytes(true));
    assertTrue(Demo.memoryRefusal(onGpus, GIB).isEmpty());
  }

  @Test
  void aChildsDeathIsDescribedByExitCodeSignalOrOutOfMemory() {
    assertEquals("exited with code 3", ChildProcess.describeExit(3, false, false));
    String oom = ChildProcess.describeExit(137, false, false);
    assertTrue(oom.contains("SIGKILL") && oom.contains("out-of-memory killer"), oom);
    String ours = ChildProcess.describeExit(137, true, false);
    assertTrue(ours.contains("SIGKILL") && !ours.contains("out-of-memory"), ours);
    assertTrue(ChildProcess.describeExit(139, false, false).contains("SIGSEGV"));
    assertTrue(ChildProcess.describeExit(1, false, true).contains("OutOfMemoryError"));
  }
}
