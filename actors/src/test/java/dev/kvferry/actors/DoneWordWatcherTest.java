package dev.kvferry.actors;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvferry.rdma.cuda.SharedDoneWords;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;
import org.apache.pekko.actor.testkit.typed.javadsl.ActorTestKit;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.ValueSource;

/**
 * D's done-word watcher, with this test storing the words as P would: through a second mapping of
 * the same /dev/shm file, as a GPU stream stores (no bell: the watcher polls) or as a CPU of a
 * host transport stores (then ringing the bell the watcher sleeps on).
 */
class DoneWordWatcherTest {
  /** For its probes' awaitAssert only: the watcher is a thread, not an actor. */
  private static final ActorTestKit KIT = ActorTestKit.create();
  private final LinkedBlockingQueue<String> seen = new LinkedBlockingQueue<>();
  private DoneWordWatcher watcher;
  /** Whether this test's stores ring the bell (the watcher was made to sleep on it). */
  private boolean ring;

  private void open(boolean belled) {
    ring = belled;
    watcher = DoneWordWatcher.tryCreate("test", belled, seen::add);
    assertNotNull(watcher, "/dev/shm is writable here");
  }

  @AfterAll
  static void stopKit() {
    KIT.shutdownTestKit();
  }

  @AfterEach
  void close() {
    if (watcher != null) {
      watcher.close();
    }
  }

  @ParameterizedTest(name = "belled {0}")
  @ValueSource(booleans = {false, true})
  void reportsATransferOnceItsWordHoldsItsValueAndNotBefore(boolean belled) throws Exception {
    open(belled);
    DoneWordWatcher.Ticket a = watcher.register("tx-a", 1)[0];
    DoneWordWatcher.Ticket b = watcher.register("tx-b", 1)[0];
    assertTrue(b.value() > a.value());
    store(b, b.value() - 1); // an older value in b's word: not b's store
    assertEquals(null, seen.poll(200, TimeUnit.MILLISECONDS));
    store(b, b.value());
    assertEquals("tx-b", seen.poll(10, TimeUnit.SECONDS));
    store(a, a.value());
    assertEquals("tx-a", seen.poll(10, TimeUnit.SECONDS));
    assertEquals(null, seen.poll(200, TimeUnit.MILLISECONDS), "each transfer reported once");
  }

  @ParameterizedTest(name = "belled {0}")
  @ValueSource(booleans = {false, true})
  void hintsOfATransfersLastLayersReportNothingAndItsDoneValueStillDoes(boolean belled)
      throws Exception {
    open(belled);
    DoneWordWatcher.Ticket t = watcher.register("tx-hinted", 1)[0];
    store(t, SharedDoneWords.progressValue(t.value(), 8)); // layer 0 of 8 landed: far
    assertEquals(null, seen.poll(200, TimeUnit.MILLISECONDS));
    assertEquals(0, watcher.nearHints(), "8 layers behind is not near the end");
    store(t, SharedDoneWords.progressValue(t.value(), LayerWriter.NEAR_LAYERS));
    KIT.createTestProbe().awaitAssert(Duration.ofSeconds(10), () -> {
      assertEquals(1, watcher.nearHints(), "the second-to-last layer's hint is seen as near");
      return null;
    });
    assertEquals(null, seen.poll(200, TimeUnit.MILLISECONDS), "a hint completes nothing");
    store(t, t.value());
    assertEquals("tx-hinted", seen.poll(10, TimeUnit.SECONDS));
  }

  @ParameterizedTest(name = "belled {0}")
  @ValueSource(booleans = {false, true})
  void aTransferOfThreeWritersIsReportedOnceEveryWordHoldsItsValue(boolean belled)
      throws Exception {
    open(belled);
    DoneWordWatcher.Ticket[] parts = watcher.register("tx-three", 3);
    assertEquals(3, parts.length);
    assertEquals(3, java.util.Arrays.stream(parts).mapToInt(DoneWordWatcher.Ticket::slot)
        .distinct().count(), "each writer has a slot of its own");
    store(parts[2], parts[2].value());
    store(parts[0], parts[0].value());
    assertEquals(null, seen.poll(300, TimeUnit.MILLISECONDS), "one writer is still writing");
    store(parts[1], parts[1].value());
    assertEquals("tx-three", seen.poll(10, TimeUnit.SECONDS));
    assertEquals(null, seen.poll(200, TimeUnit.MILLISECONDS), "reported once");
  }

  @Test
  void aTransferSpinsOnlyOnceEveryWritersHintSaysItIsNear() throws Exception {
    open(false);
    DoneWordWatcher.Ticket[] parts = watcher.register("tx-hints", 2);
    store(parts[0], SharedDoneWords.progressValue(parts[0].value(), LayerWriter.NEAR_LAYERS));
    store(parts[1], SharedDoneWords.progressValue(parts[1].value(), 8));
    KIT.createTestProbe().expectNoMessage(Duration.ofMillis(200));
    assertEquals(0, watcher.nearHints(), "one writer is 8 layers behind");
    store(parts[1], SharedDoneWords.progressValue(parts[1].value(), LayerWriter.NEAR_LAYERS));
    KIT.createTestProbe().awaitAssert(Duration.ofSeconds(10), () -> {
      assertEquals(1, watcher.nearHints(), "both writers near their last layer");
      return null;
    });
    assertEquals(null, seen.poll(200, TimeUnit.MILLISECONDS), "hints complete nothing");
  }

  @Test
  void aTransferTakesOneToMaxPartsWords() {
    open(false);
    org.junit.jupiter.api.Assertions.assertThrows(IllegalArgumentException.class,
        () -> watcher.register("tx-none", 0));
    org.junit.jupiter.api.Assertions.assertThrows(IllegalArgumentException.class,
        () -> watcher.register("tx-many", DoneWordWatcher.MAX_PARTS + 1));
    assertEquals(DoneWordWatcher.MAX_PARTS,
        watcher.register("tx-max", DoneWordWatcher.MAX_PARTS).length);
  }

  @ParameterizedTest(name = "belled {0}")
  @ValueSource(booleans = {false, true})
  void aForgottenTransferIsNotReported(boolean belled) throws Exception {
    open(belled);
    DoneWordWatcher.Ticket t = watcher.register("tx-gone", 1)[0];
    watcher.forget("tx-gone");
    store(t, t.value());
    assertEquals(null, seen.poll(300, TimeUnit.MILLISECONDS));
  }

  @ParameterizedTest(name = "belled {0}")
  @ValueSource(booleans = {false, true})
  void aSlotReusedWhileItsTransferIsPendingFallsBackToMessages(boolean belled) throws Exception {
    open(belled);
    DoneWordWatcher.Ticket first = watcher.register("tx-old", 1)[0];
    DoneWordWatcher.Ticket reuse = null;
    for (int i = 0; i < DoneWordWatcher.SLOTS; i++) {
      DoneWordWatcher.Ticket t = watcher.register("tx-" + i, 1)[0];
      watcher.forget("tx-" + i);
      if (t.slot() == first.slot()) {
        reuse = t;
      }
    }
    assertNotNull(reuse);
    assertTrue(reuse.value() > first.value());
    // The newer transfer's value in the shared slot must not complete the old one.
    store(reuse, reuse.value());
    assertEquals(null, seen.poll(300, TimeUnit.MILLISECONDS));
    assertFalse(seen.contains("tx-old"));
  }

  @Test
  void aWordStoredWithoutARingIsStillSeenBySleepingWatcher() throws Exception {
    open(true);
    DoneWordWatcher.Ticket t = watcher.register("tx-quiet", 1)[0];
    ring = false; // a P that stores and does not ring: the watcher's timed sleep still ends
    store(t, t.value());
    assertEquals("tx-quiet", seen.poll(10, TimeUnit.SECONDS));
  }

  /** Stores as P does: the CPU through its own mapping of D's file, then the bell if rung. */
  private void store(DoneWordWatcher.Ticket t, long value) throws Exception {
    try (SharedDoneWords p = SharedDoneWords.openPeerWordsForCpu(t.name(), t.slots())) {
      if (ring) {
        p.store(t.slot(), value);
      } else {
        p.set(t.slot(), value); // as a GPU stream stores: no ring
      }
    }
    assertTrue(Files.exists(SharedDoneWords.PEER_DIR.resolve(t.name())));
  }

  @Test
  void doneWordFilesOfProcessesThatAreGoneAreSweptAndThoseOfLiveOnesKept(@org.junit.jupiter.api.io.TempDir Path dir)
      throws Exception {
    long ownPid = ProcessHandle.current().pid();
    long deadPid = 4_000_000_000L; // above any Linux pid_max: no such process
    Path dead = Files.write(dir.resolve("kvferry-done-decode-0_tp0-" + deadPid + "-ab12"), new byte[8]);
    Path live = Files.write(dir.resolve("kvferry-done-decode-0_tp0-" + ownPid + "-cd34"), new byte[8]);
    Path other = Files.write(dir.resolve("someone-else-" + deadPid + "-ab12"), new byte[8]);
    assertEquals(1, DoneWordWatcher.sweepStale(dir));
    assertFalse(Files.exists(dead), "a killed decode's file stays in /dev/shm");
    assertTrue(Files.exists(live));
    assertTrue(Files.exists(other));
  }
}
