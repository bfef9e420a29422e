package dev.kvferry.engine.port;

import java.util.OptionalInt;

/**
 * Which slots of a worker's exported load-event ring (the node's interprocess CUDA events that
 * {@code wait_for_layer_load} names) may be recorded. A slot handed to the engine stays busy until
 * the worker's next step begins ({@code start_load_kv}): the client makes its stream wait on the
 * event before it sends any later op on the connection, so by then that wait is queued and bound
 * to the record, and recording the slot again cannot make it wait for less. Slots go round, so a
 * slot is recorded again as late as the ring allows. Not thread-safe: one worker connection's
 * thread uses it.
 */
final class LoadEventRing {

  private final int size;
  private int next;
  private int busy;

  LoadEventRing(int size) {
    if (size < 1) {
      throw new IllegalArgumentException("a load-event ring needs at least 1 slot, got " + size);
    }
    this.size = size;
  }

  int size() {
    return size;
  }

  /** Slots handed out since the step began. */
  int busy() {
    return busy;
  }

  /** A free slot, now busy; empty when every slot is busy this step (the caller waits on the CPU). */
  OptionalInt take() {
    if (busy == size) {
      return OptionalInt.empty();
    }
    int slot = next;
    next = (next + 1) % size;
    busy++;
    return OptionalInt.of(slot);
  }

  /** Gives back the slot just taken, never recorded (nothing was in flight to wait for). */
  void returnUnused(int slot) {
    int last = (next - 1 + size) % size;
    if (busy == 0 || slot != last) {
      throw new IllegalArgumentException("slot " + slot + " is not the slot last taken ("
          + (busy == 0 ? "none is busy" : last) + ")");
    }
    next = last;
    busy--;
  }

  /** The worker's next step begins: every wait on a slot handed out before is queued. */
  void stepBegins() {
    busy = 0;
  }
}
