package dev.kvferry.rdma;

import java.util.concurrent.atomic.AtomicInteger;

/**
 * Memory that copies may still be using when its owner closes it: each copy pins it, and the
 * release (free, unmap) runs once, after {@link #close()} and the last {@link #unpin()}, so no
 * copy ever touches released memory.
 */
final class PinGate {

  private static final int CLOSED_BIT = Integer.MIN_VALUE;

  /** Pins in flight (low bits) plus {@link #CLOSED_BIT}. */
  private final AtomicInteger pins = new AtomicInteger();
  private final Runnable release;

  PinGate(Runnable release) {
    this.release = release;
  }

  /** Takes a pin; false (nothing taken) once closed. */
  boolean tryPin() {
    while (true) {
      int p = pins.get();
      if ((p & CLOSED_BIT) != 0) {
        return false;
      }
      if (pins.compareAndSet(p, p + 1)) {
        return true;
      }
    }
  }

  /** Releases a pin taken by {@link #tryPin()}; releases the memory if it was the last after close. */
  void unpin() {
    if (pins.decrementAndGet() == CLOSED_BIT) {
      release.run();
    }
  }

  /** No new pins; releases the memory now if none is held, else at the last unpin. Idempotent. */
  void close() {
    if (pins.getAndUpdate(p -> p | CLOSED_BIT) == 0) {
      release.run();
    }
  }
}
