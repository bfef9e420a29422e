package dev.kvferry.rdma;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assumptions.assumeTrue;

import com.sun.jna.Platform;
import java.util.concurrent.atomic.AtomicLong;
import org.junit.jupiter.api.Test;

class TimerSlackTest {
  @Test
  void setsTheCallingThreadsSlackAndNoOtherThreads() throws Exception {
    assumeTrue(Platform.isLinux(), "prctl(PR_SET_TIMERSLACK) is Linux's");
    long before = TimerSlack.get();
    assertTrue(before > 0, "a thread's slack is readable: " + before);
    long want = before == 1_000 ? 2_000 : 1_000; // differs from what the thread inherits
    AtomicLong inside = new AtomicLong();
    Thread t = new Thread(() -> {
      assertTrue(TimerSlack.set(want));
      inside.set(TimerSlack.get());
    });
    t.start();
    t.join();
    assertEquals(want, inside.get());
    assertEquals(before, TimerSlack.get(), "this thread's slack is untouched");
  }

  @Test
  void refusesASlackBelowOneNanosecond() {
    assertThrows(IllegalArgumentException.class, () -> TimerSlack.set(0));
  }
}
