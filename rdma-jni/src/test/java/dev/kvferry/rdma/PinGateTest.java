package dev.kvferry.rdma;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.concurrent.atomic.AtomicInteger;
import org.junit.jupiter.api.Test;

class PinGateTest {

  @Test
  void releasesOnceAfterCloseAndTheLastUnpin() {
    AtomicInteger released = new AtomicInteger();
    PinGate gate = new PinGate(released::incrementAndGet);
    assertTrue(gate.tryPin());
    assertTrue(gate.tryPin());
    gate.close();
    assertFalse(gate.tryPin(), "no new pin once closed");
    gate.unpin();
    assertEquals(0, released.get(), "one copy still holds it");
    gate.unpin();
    assertEquals(1, released.get());
    gate.close();
    assertEquals(1, released.get(), "closing again releases nothing more");
  }

  @Test
  void closingWithNoPinReleasesAtOnce() {
    AtomicInteger released = new AtomicInteger();
    PinGate gate = new PinGate(released::incrementAndGet);
    assertTrue(gate.tryPin());
    gate.unpin();
    assertEquals(0, released.get(), "open: unpinning releases nothing");
    gate.close();
    assertEquals(1, released.get());
  }
}
