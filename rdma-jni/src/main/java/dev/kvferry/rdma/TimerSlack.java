package dev.kvferry.rdma;

/**
 * The calling thread's timer slack (Linux {@code prctl(PR_SET_TIMERSLACK)}): how late the kernel
 * may end a timed sleep so it can batch wake-ups. The default, 50 us, stretches a 20 us park to
 * about 70 us; a thread that polls in short parks sets its own slack to the park's scale. Where
 * the call is missing (another OS) {@link #set} does nothing and says so.
 */
public final class TimerSlack {
  private static final int PR_SET_TIMERSLACK = 29;
  private static final int PR_GET_TIMERSLACK = 30;
  private static final boolean AVAILABLE = LinuxCalls.register(TimerSlack.class);

  private TimerSlack() {}

  // prctl(2) is variadic; on the Linux ABIs its integer arguments travel as fixed ones.
  private static native int prctl(int option, long arg2, long arg3, long arg4, long arg5);

  /**
   * Sets the calling thread's slack to {@code nanos} (at least 1). Returns whether it was set;
   * false where prctl is not available or refused it (the thread keeps its slack).
   */
  public static boolean set(long nanos) {
    if (nanos < 1) {
      throw new IllegalArgumentException("timer slack must be at least 1 ns, not " + nanos);
    }
    return AVAILABLE && prctl(PR_SET_TIMERSLACK, nanos, 0, 0, 0) == 0;
  }

  /** The calling thread's slack in nanoseconds, or -1 where it cannot be read. */
  public static long get() {
    return AVAILABLE ? prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0) : -1;
  }
}
