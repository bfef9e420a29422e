package dev.kvferry.rdma;

/**
 * Where a transport's latest copy spent its time, for the bench's breakdown of one layer's write
 * (issue 19): when it was handed to the transport's executor, when a thread started it, when its
 * bytes were in place. Off unless {@link #enable()} was called (or {@code -Dkvferry.stamps=true}):
 * then each mark is one {@link System#nanoTime()}; off, a static boolean test. Only the latest
 * copy's times are kept, so they mean something only while copies do not overlap.
 */
public final class CopyStamps {
  private static boolean on = Boolean.getBoolean("kvferry.stamps");
  private static volatile long handedOffNanos;
  private static volatile long startedNanos;
  private static volatile long copiedNanos;
  private static volatile long wordStoredNanos;
  private static volatile long plannedNanos;

  private CopyStamps() {}

  /** Turns marking on; call before the transports' threads start. */
  public static void enable() {
    on = true;
  }

  public static boolean enabled() {
    return on;
  }

  /** Forgets the latest copy (0: not seen since). */
  public static void reset() {
    handedOffNanos = 0;
    startedNanos = 0;
    copiedNanos = 0;
    wordStoredNanos = 0;
  }

  /** A new plan was uploaded for the copy kernel (cuda: a transfer's first layer). */
  static void planned() {
    if (on) {
      plannedNanos = System.nanoTime();
    }
  }

  /** The latest plan upload's end (0: none since start). */
  public static long plannedNanos() {
    return plannedNanos;
  }

  static void wordStored() {
    if (on) {
      wordStoredNanos = System.nanoTime();
    }
  }

  /** The latest done word stored into a peer's mapped words (cma). */
  public static long wordStoredNanos() {
    return wordStoredNanos;
  }

  static void handedOff() {
    if (on) {
      handedOffNanos = System.nanoTime();
    }
  }

  static void started() {
    if (on) {
      startedNanos = System.nanoTime();
    }
  }

  static void copied() {
    if (on) {
      copiedNanos = System.nanoTime();
    }
  }

  /** The latest copy handed to an executor thread (0 when it ran in the caller's thread). */
  public static long handedOffNanos() {
    return handedOffNanos;
  }

  /** The latest copy started moving bytes. */
  public static long startedNanos() {
    return startedNanos;
  }

  /** The latest copy's bytes were in place. */
  public static long copiedNanos() {
    return copiedNanos;
  }
}
