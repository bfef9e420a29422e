package dev.kvferry.engine.port;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.OptionalInt;
import org.junit.jupiter.api.Test;

/** When a slot of the node's exported load-event ring may be recorded again. */
class LoadEventRingTest {

  @Test
  void slotsHandedOutInAStepAreNotReusedInThatStep() {
    LoadEventRing ring = new LoadEventRing(3);
    assertEquals(OptionalInt.of(0), ring.take());
    assertEquals(OptionalInt.of(1), ring.take());
    assertEquals(OptionalInt.of(2), ring.take());
    assertEquals(OptionalInt.empty(), ring.take()); // the caller falls back to the CPU wait
    assertEquals(3, ring.busy());
  }

  @Test
  void theNextStepFreesTheSlotsAndGoesOnRound() {
    LoadEventRing ring = new LoadEventRing(4);
    ring.take();
    ring.take();
    ring.stepBegins();
    assertEquals(0, ring.busy());
    // Slot 0 was the last step's: it is recorded again only after slots 2 and 3.
    assertEquals(OptionalInt.of(2), ring.take());
    assertEquals(OptionalInt.of(3), ring.take());
    assertEquals(OptionalInt.of(0), ring.take());
    assertEquals(OptionalInt.of(1), ring.take());
    assertEquals(OptionalInt.empty(), ring.take());
  }

  @Test
  void aSlotNeverRecordedGoesBackAndIsTakenNext() {
    LoadEventRing ring = new LoadEventRing(2);
    int s = ring.take().getAsInt();
    ring.returnUnused(s);
    assertEquals(0, ring.busy());
    assertEquals(OptionalInt.of(s), ring.take());
    assertEquals(OptionalInt.of(1), ring.take());
    ring.returnUnused(1);
    assertEquals(OptionalInt.of(1), ring.take());
  }

  @Test
  void onlyTheSlotLastTakenCanGoBack() {
    LoadEventRing ring = new LoadEventRing(3);
    IllegalArgumentException none =
        assertThrows(IllegalArgumentException.class, () -> ring.returnUnused(2));
    assertTrue(none.getMessage().contains("none is busy"), none.getMessage());
    ring.take();
    ring.take();
    IllegalArgumentException older =
        assertThrows(IllegalArgumentException.class, () -> ring.returnUnused(0));
    assertTrue(older.getMessage().contains("slot 0"), older.getMessage());
    assertEquals(2, ring.busy());
  }

  @Test
  void aRingNeedsASlot() {
    assertThrows(IllegalArgumentException.class, () -> new LoadEventRing(0));
  }
}
