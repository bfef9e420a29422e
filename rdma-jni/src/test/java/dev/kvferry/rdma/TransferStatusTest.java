package dev.kvferry.rdma;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import org.junit.jupiter.api.Test;

/**
 * A status's first actions (what a peer waits on right behind the bytes, the done word) run in
 * the thread that ends it, before anything chained on its completion, once each, also when added
 * after the end; and {@link PeerDoneWords#whenLanded} runs once every write has ended, in the
 * thread that ended the last, ahead of that write's other dependents.
 */
class TransferStatusTest {

  @Test
  void firstActionsRunBeforeTheCompletionsDependentsInTheEndingThread() throws Exception {
    TransferStatus s = TransferStatus.pending();
    List<String> order = new ArrayList<>();
    s.completion().thenRun(() -> order.add("chained"));
    s.whenEndedFirst(() -> order.add("first " + Thread.currentThread().getName()));
    s.whenEndedFirst(() -> order.add("second"));
    Thread ender = new Thread(() -> s.succeed(8), "ender");
    ender.start();
    ender.join();
    assertEquals(List.of("first ender", "second", "chained"), order);
  }

  @Test
  void anActionAddedAfterTheEndRunsAtOnceAndOnlyOnce() {
    TransferStatus s = TransferStatus.failed("gone");
    AtomicInteger runs = new AtomicInteger();
    s.whenEndedFirst(runs::incrementAndGet);
    assertEquals(1, runs.get());
    assertFalse(s.succeed(1), "the first outcome wins");
    assertEquals(1, runs.get(), "a second end runs nothing again");
  }

  @Test
  void actionsAddedWhileAnotherThreadEndsTheStatusEachRunOnce() throws Exception {
    for (int round = 0; round < 200; round++) {
      TransferStatus s = TransferStatus.pending();
      AtomicInteger runs = new AtomicInteger();
      Thread ender = new Thread(() -> s.succeed(1));
      ender.start();
      for (int i = 0; i < 20; i++) {
        s.whenEndedFirst(runs::incrementAndGet);
      }
      ender.join(TimeUnit.SECONDS.toMillis(30));
      assertEquals(20, runs.get(), "round " + round);
    }
  }

  @Test
  void anErrorInAnActionStillCompletesTheStatus() {
    TransferStatus s = TransferStatus.pending();
    s.whenEndedFirst(() -> {
      throw new AssertionError("an Error, not an exception");
    });
    assertThrows(AssertionError.class, () -> s.succeed(1));
    assertTrue(s.completion().isDone(), "a waiter on the completion must not hang");
    assertTrue(s.succeeded());
  }

  @Test
  void aThrowingActionNeitherStopsTheOthersNorTheCompletion() {
    TransferStatus s = TransferStatus.pending();
    AtomicInteger after = new AtomicInteger();
    s.whenEndedFirst(() -> {
      throw new IllegalStateException("a bug in an action");
    });
    s.whenEndedFirst(after::incrementAndGet);
    assertTrue(s.succeed(1));
    assertEquals(1, after.get());
    assertTrue(s.completion().isDone());
  }

  @Test
  void whenLandedWaitsForEveryWriteAndRunsFirstInTheLastWritesThread() throws Exception {
    TransferStatus a = TransferStatus.pending();
    TransferStatus b = TransferStatus.pending();
    List<String> order = new CopyOnWriteArrayList<>();
    b.completion().thenRun(() -> order.add("b chained"));
    PeerDoneWords.whenLanded(List.of(a, b), failure ->
        order.add("landed in " + Thread.currentThread().getName() + ", failure " + failure));
    a.succeed(1);
    assertTrue(order.isEmpty(), "one write is still in flight");
    Thread last = new Thread(() -> b.succeed(1), "last-write");
    last.start();
    last.join(TimeUnit.SECONDS.toMillis(30));
    assertEquals(List.of("landed in last-write, failure null", "b chained"), order);
  }

  @Test
  void whenLandedCarriesTheFirstFailureAndRunsAtOnceForNoWrites() {
    TransferStatus ok = TransferStatus.succeeded(1);
    TransferStatus bad = TransferStatus.pending();
    List<String> seen = new ArrayList<>();
    PeerDoneWords.whenLanded(List.of(ok, bad), seen::add);
    assertTrue(seen.isEmpty());
    bad.fail("peer went away");
    bad.fail("a second failure changes nothing");
    assertEquals(List.of("a write of the transfer failed (peer went away)"), seen);
    List<String> none = new ArrayList<>();
    PeerDoneWords.whenLanded(List.of(), none::add);
    assertEquals(1, none.size());
    assertNull(none.get(0));
  }

  @Test
  void storeWhenLandedEndsByTheStoreOrTheFirstFailureAndAThrowingStoreFailsIt() {
    TransferStatus write = TransferStatus.pending();
    TransferStatus stored = PeerDoneWords.storeWhenLanded(List.of(write), s -> s.succeed(8));
    assertFalse(stored.completion().isDone(), "the write is still in flight");
    write.succeed(1);
    assertTrue(stored.succeeded());

    List<String> stores = new ArrayList<>();
    TransferStatus refused = PeerDoneWords.storeWhenLanded(
        List.of(TransferStatus.failed("peer went away")), s -> stores.add("stored"));
    assertEquals("done word not stored: a write of the transfer failed (peer went away)",
        refused.failureMessage());
    assertTrue(stores.isEmpty(), "nothing is stored behind a failed write");

    TransferStatus thrown = PeerDoneWords.storeWhenLanded(List.of(), s -> {
      throw new IllegalStateException("mapping gone");
    });
    assertTrue(thrown.completion().isDone(), "no transfer may wait on a word never stored");
    assertEquals("done word not stored: java.lang.IllegalStateException: mapping gone",
        thrown.failureMessage());
  }
}
