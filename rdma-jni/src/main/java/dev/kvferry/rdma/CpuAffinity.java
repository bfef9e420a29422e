package dev.kvferry.rdma;

import com.sun.jna.LastErrorException;
import java.util.Arrays;
import org.jspecify.annotations.Nullable;

/**
 * Pins a thread to one of the CPUs this process may use (Linux {@code sched_setaffinity}). The
 * cma copy threads share one copy and must run side by side: on this project's VMs the kernel
 * woke both onto the CPU already busy and left the other idle for most of a layer's copy
 * (docs/performance.md, "copy threads stacked on one CPU").
 */
final class CpuAffinity {
  /** CPU ids this class handles: 0 to 1,023 (sixteen 64-bit words of mask). */
  static final int MAX_CPUS = 1024;
  private static final int MASK_WORDS = MAX_CPUS / 64;

  private CpuAffinity() {}

  /** The CPUs the calling thread may run on, ascending; empty where the kernel will not say. */
  static int[] allowedCpus() {
    long[] mask = new long[MASK_WORDS];
    try {
      LibC.sched_getaffinity(0, 8L * MASK_WORDS, mask);
    } catch (LastErrorException | UnsatisfiedLinkError e) {
      return new int[0];
    }
    int[] cpus = new int[64 * MASK_WORDS];
    int n = 0;
    for (int cpu = 0; cpu < cpus.length; cpu++) {
      if ((mask[cpu / 64] & (1L << (cpu % 64))) != 0) {
        cpus[n++] = cpu;
      }
    }
    return Arrays.copyOf(cpus, n);
  }

  /**
   * Pins the calling thread to {@code cpu}. Returns whether it was pinned; where it cannot be (no
   * such call, a CPU taken away since the transport checked) the thread runs where the kernel
   * puts it, as without.
   */
  static boolean pinCaller(int cpu) {
    long[] mask = new long[MASK_WORDS];
    mask[cpu / 64] = 1L << (cpu % 64);
    try {
      LibC.sched_setaffinity(0, 8L * MASK_WORDS, mask);
      return true;
    } catch (LastErrorException | UnsatisfiedLinkError e) {
      return false;
    }
  }

  /**
   * Why {@code cpus} cannot be pinned to, or null when they can: every one must be a CPU this
   * process may run on. Where the kernel will not say which those are, none is refused.
   */
  static @Nullable String refusal(int[] cpus) {
    int[] allowed = allowedCpus();
    if (allowed.length == 0) {
      return null;
    }
    for (int cpu : cpus) {
      if (Arrays.binarySearch(allowed, cpu) < 0) {
        return "CPU " + cpu + " is not one this process may run on (allowed: "
            + Arrays.toString(allowed) + ")";
      }
    }
    return null;
  }
}
