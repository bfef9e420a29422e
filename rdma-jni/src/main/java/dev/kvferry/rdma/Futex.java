package dev.kvferry.rdma;

import com.sun.jna.Memory;
import com.sun.jna.Platform;
import com.sun.jna.Pointer;

/**
 * Linux futexes on a 32-bit word in memory shared between processes (a {@code MAP_SHARED} file):
 * one process sleeps in {@link #await} until another changes the word and calls {@link #wake}.
 * The shared (not {@code FUTEX_PRIVATE}) operations, so the kernel keys the wait on the file's
 * page, not on one process's address. Where the call is missing (another OS, an unknown
 * architecture) {@link #available} is false and callers poll instead.
 */
public final class Futex {
  private static final int FUTEX_WAIT = 0;
  private static final int FUTEX_WAKE = 1;
  /** SYS_futex: the number differs by architecture. */
  private static final long SYS_FUTEX = switch (Platform.ARCH) {
    case "x86-64" -> 202;
    case "aarch64" -> 98;
    default -> -1;
  };
  private static final boolean AVAILABLE = register();
  /** A relative timeout, {@code struct timespec}, per waiting thread. */
  private static final ThreadLocal<Memory> TIMEOUT = ThreadLocal.withInitial(() -> new Memory(16));

  private Futex() {}

  private static boolean register() {
    return SYS_FUTEX >= 0 && LinuxCalls.register(Futex.class);
  }

  // syscall(2) is variadic; on the Linux ABIs above its integer arguments travel as fixed ones.
  private static native long syscall(
      long number, long address, long op, long value, long timeout, long address2, long value3);

  public static boolean available() {
    return AVAILABLE;
  }

  /**
   * Sleeps while the int at {@code address} still holds {@code expected}, at most {@code
   * timeoutNanos}; returns at once if it holds something else. Returns early on a wake-up, a
   * signal or spuriously: callers re-check what they wait for.
   */
  public static void await(long address, int expected, long timeoutNanos) {
    if (!AVAILABLE) {
      throw new UnsupportedOperationException("futexes are not available here");
    }
    Memory t = TIMEOUT.get();
    t.setLong(0, timeoutNanos / 1_000_000_000L);
    t.setLong(8, timeoutNanos % 1_000_000_000L);
    syscall(SYS_FUTEX, address, FUTEX_WAIT, expected, Pointer.nativeValue(t), 0, 0);
  }

  /** Wakes every thread of any process sleeping in {@link #await} on {@code address}. */
  public static void wake(long address) {
    if (AVAILABLE) {
      syscall(SYS_FUTEX, address, FUTEX_WAKE, Integer.MAX_VALUE, 0, 0, 0);
    }
  }
}
