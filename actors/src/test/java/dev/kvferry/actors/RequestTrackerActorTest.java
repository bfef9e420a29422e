package dev.kvferry.actors;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvferry.actors.connector.Finished;
import dev.kvferry.actors.engine.ConnectorSettings;
import java.time.Duration;
import java.util.Set;
import org.apache.pekko.actor.testkit.typed.javadsl.ActorTestKit;
import org.apache.pekko.actor.testkit.typed.javadsl.TestProbe;
import org.apache.pekko.actor.typed.ActorRef;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;

/** The RequestTrackerActor on its own: deadlines, each ending reported once, late messages. */
class RequestTrackerActorTest {

  /** A reader that left gets 200 ms (2 handshake attempts of 100 ms) to show itself again. */
  private static final ConnectorSettings SHORT_GRACE =
      ConnectorSettings.DEFAULTS.withHandshake(Duration.ofMillis(100), 2, Duration.ofMillis(10));

  private final ActorTestKit kit = ActorTestKit.create();
  private final java.util.List<TransferObserver.Outcome> observed =
      java.util.Collections.synchronizedList(new java.util.ArrayList<>());
  private final FinishedSink sink =
      new FinishedSink((outcome, bytes, nanos) -> observed.add(outcome));
  private final TestProbe<EngineActor.Command> owner = kit.createTestProbe();

  @AfterEach
  void stop() {
    kit.shutdownTestKit();
  }

  private ActorRef<RequestTrackerActor.Command> tracker(ConnectorSettings s) {
    return kit.spawn(RequestTrackerActor.create("test/tp0", s, sink, owner.ref()));
  }

  /** Drains the sink until {@code expected} holds, then checks nothing more arrives. */
  private Finished awaitExactly(java.util.function.Predicate<Finished> expected) {
    Finished[] seen = new Finished[1];
    TestProbe<Object> p = kit.createTestProbe();
    p.awaitAssert(Duration.ofSeconds(5), Duration.ofMillis(10), () -> {
      Finished f = sink.drain();
      if (!f.isEmpty()) {
        seen[0] = f;
      }
      assertTrue(seen[0] != null && expected.test(seen[0]), "so far: " + seen[0]);
      return null;
    });
    return seen[0];
  }

  @Test
  void prefillFreesBlocksAtTheReadAbortDeadlineWhenDecodeNeverComes() {
    ActorRef<RequestTrackerActor.Command> t = tracker(ConnectorSettings.DEFAULTS);
    t.tell(new RequestTrackerActor.ExpectRelease("r1", "tx1", System.currentTimeMillis() + 200, "d"));
    assertEquals(Set.of("r1"), awaitExactly(f -> f.doneSending().contains("r1")).doneSending());
    // The release that comes after the deadline is late: ignored, nothing reported twice.
    t.tell(new RequestTrackerActor.Released("tx1"));
    kit.createTestProbe().expectNoMessage(Duration.ofMillis(200));
    assertTrue(sink.drain().isEmpty());
  }

  @Test
  void eachEndingIsReportedOnceAndLateOrDuplicateMessagesAreIgnored() {
    ActorRef<RequestTrackerActor.Command> t = tracker(ConnectorSettings.DEFAULTS);
    t.tell(new RequestTrackerActor.ExpectReceive("r1", "tx1", "prefill-0"));
    t.tell(new RequestTrackerActor.ReceiveSucceeded("tx1", 100));
    t.tell(new RequestTrackerActor.ReceiveSucceeded("tx1", 100)); // duplicate
    t.tell(new RequestTrackerActor.TransferFailed("tx1", "late failure")); // late
    Finished f = awaitExactly(x -> x.doneReceiving().contains("r1"));
    assertEquals(Set.of("r1"), f.doneReceiving());
    assertTrue(f.failed().isEmpty(), f.toString());
    kit.createTestProbe().expectNoMessage(Duration.ofMillis(200));
    assertTrue(sink.drain().isEmpty(), "reported twice");
  }

  @Test
  void aDuplicateTransferIdIsRefusedWithoutDisturbingTheFirst() {
    ActorRef<RequestTrackerActor.Command> t = tracker(ConnectorSettings.DEFAULTS);
    t.tell(new RequestTrackerActor.ExpectReceive("r1", "tx1", "prefill-0"));
    t.tell(new RequestTrackerActor.ExpectReceive("r2", "tx1", "prefill-0"));
    Finished f = awaitExactly(x -> x.failed().containsKey("r2"));
    assertTrue(f.failed().get("r2").contains("duplicate transfer id tx1"), f.toString());
    t.tell(new RequestTrackerActor.ReceiveSucceeded("tx1", 1));
    assertEquals(Set.of("r1"), awaitExactly(x -> x.doneReceiving().contains("r1")).doneReceiving());
  }

  @Test
  void aReceiveThatOutlivesTheTransferTimeoutAsksItsOwnerToEndItAndFreesNothingBeforeItEnded() {
    ActorRef<RequestTrackerActor.Command> t =
        tracker(ConnectorSettings.DEFAULTS.withTransferTimeout(Duration.ofMillis(200)));
    t.tell(new RequestTrackerActor.ExpectReceive("r1", "tx1", "prefill-7", new int[] {4, 5}));
    EngineActor.ReceiveOverdue overdue =
        owner.expectMessageClass(EngineActor.ReceiveOverdue.class, Duration.ofSeconds(5));
    assertEquals("tx1", overdue.transferId());
    assertTrue(overdue.reason().contains("prefill-7"), overdue.reason());
    // A timeout is a request to end the transfer: the engine is not told to free anything yet.
    owner.expectNoMessage(Duration.ofMillis(300));
    assertTrue(sink.drain().isEmpty(), "reported before the owner ended the transfer");

    t.tell(new RequestTrackerActor.TransferFailed("tx1", overdue.reason()));
    Finished f = awaitExactly(x -> x.failed().containsKey("r1"));
    assertTrue(f.failed().get("r1").contains("prefill-7"), f.toString());
    assertEquals(Set.of(4, 5), f.blockIdsWithLoadErrors(), "load errors in the same report");
  }

  @Test
  void aDoneWordReportsTheReceiveAtOnceAndTheTrackerReportsNothingMoreWhateverEndsItAfter() {
    ActorRef<RequestTrackerActor.Command> t = tracker(ConnectorSettings.DEFAULTS);
    t.tell(new RequestTrackerActor.ExpectReceive("r1", "tx1", "prefill-0", new int[] {1}));
    t.tell(new RequestTrackerActor.ExpectReceive("r2", "tx2", "prefill-0", new int[] {2}));
    sink.expectEarlyDone("tx1", "r1");
    sink.expectEarlyDone("tx2", "r2");
    // The watcher's thread, no actor in between: the engine's next drain has it.
    assertTrue(sink.landedEarly("tx1", true, 0));
    assertFalse(sink.landedEarly("tx1", true, 0), "a word seen twice reported twice");
    assertEquals(Set.of("r1"), sink.drain().doneReceiving());
    // Then the receiver's own ending arrives: the success is not reported again, and a failure
    // decided after the word (a timeout, an abort racing it) is not reported at all.
    t.tell(new RequestTrackerActor.ReceiveSucceeded("tx1", 0));
    assertTrue(sink.landedEarly("tx2", true, 0));
    t.tell(new RequestTrackerActor.TransferFailed("tx2", "overdue"));
    kit.createTestProbe().expectNoMessage(Duration.ofMillis(300));
    Finished f = sink.drain();
    assertEquals(Set.of("r2"), f.doneReceiving(), f.toString());
    assertTrue(f.failed().isEmpty() && f.blockIdsWithLoadErrors().isEmpty(), f.toString());
    assertEquals(0, sink.unsettledEarlyClaims(), "claims left behind");
    assertEquals(java.util.List.of(TransferObserver.Outcome.RECEIVED,
        TransferObserver.Outcome.RECEIVED), observed, "each receive observed once, as received");
  }

  @Test
  void aReceiveTheTrackerEndedFirstIsNotReportedDoneByALateWord() {
    ActorRef<RequestTrackerActor.Command> t = tracker(ConnectorSettings.DEFAULTS);
    t.tell(new RequestTrackerActor.ExpectReceive("r1", "tx1", "prefill-0", new int[] {4}));
    sink.expectEarlyDone("tx1", "r1");
    t.tell(new RequestTrackerActor.TransferFailed("tx1", "engine prefill-7 left"));
    Finished f = awaitExactly(x -> x.failed().containsKey("r1"));
    assertEquals(Set.of(4), f.blockIdsWithLoadErrors());
    assertFalse(sink.landedEarly("tx1", true, 0), "the word reported a receive the tracker had ended");
    assertTrue(sink.drain().isEmpty());
    assertEquals(0, sink.unsettledEarlyClaims());
  }

  /** Tells {@code t} a directory listing one worker of decode engine "decode-0". */
  private void listDecodeZero(ActorRef<RequestTrackerActor.Command> t) {
    dev.kvferry.actors.engine.EngineIdentity d = new dev.kvferry.actors.engine.EngineIdentity(
        dev.kvferry.actors.connector.Role.DECODE, "decode-0", 0, 1, 0, 1,
        dev.kvferry.actors.connector.TransferMode.READ);
    ActorRef<EngineActor.Command> dWorker =
        kit.spawn(org.apache.pekko.actor.typed.javadsl.Behaviors.empty(), d.toActorName());
    t.tell(new RequestTrackerActor.DirectoryChanged(
        dev.kvferry.actors.engine.EngineDirectory.of(java.util.List.of(dWorker))));
  }

  @Test
  void aReadWhoseDecodeEngineHasAlreadyLeftFreesItsBlocksAfterTheGraceNotAtTheDeadline() {
    ActorRef<RequestTrackerActor.Command> t = tracker(SHORT_GRACE);
    listDecodeZero(t);
    t.tell(new RequestTrackerActor.DirectoryChanged(dev.kvferry.actors.engine.EngineDirectory.EMPTY));
    long deadline = System.currentTimeMillis() + 120_000; // the read-abort timeout
    // D died before P finished the request: no later directory change would end the wait.
    t.tell(new RequestTrackerActor.ExpectRelease("r1", "tx1", deadline, "decode-0"));
    assertEquals(Set.of("r1"), awaitExactly(f -> f.doneSending().contains("r1")).doneSending());
    // An engine never listed may still be joining: its read is waited for, to the deadline.
    t.tell(new RequestTrackerActor.ExpectRelease("r2", "tx2", deadline, "decode-9"));
    kit.createTestProbe().expectNoMessage(Duration.ofMillis(300));
    assertTrue(sink.drain().isEmpty(), "freed blocks of a decode engine that may still join");
  }

  private static RequestTrackerActor.IntroducedChanged introduced(String... engineIds) {
    return new RequestTrackerActor.IntroducedChanged(Set.of(engineIds));
  }

  @Test
  void aReaderThatWentUnseenFreesWhatWasKeptForItAndWhatComesForItLaterAfterTheGrace() {
    ActorRef<RequestTrackerActor.Command> t = tracker(SHORT_GRACE);
    long deadline = System.currentTimeMillis() + 120_000;
    t.tell(introduced("decode-5", "decode-6")); // asked for our metadata; never listed here
    t.tell(new RequestTrackerActor.ExpectRelease("r1", "tx1", deadline, "decode-5"));
    t.tell(new RequestTrackerActor.ExpectRelease("r2", "tx2", deadline, "decode-6"));
    t.tell(introduced("decode-6")); // decode-5's workers stopped
    assertEquals(Set.of("r1"), awaitExactly(f -> f.doneSending().contains("r1")).doneSending());
    // Named after it went: nobody will read it, unless it attaches again within the grace.
    t.tell(new RequestTrackerActor.ExpectRelease("r3", "tx3", deadline, "decode-5"));
    assertEquals(Set.of("r3"), awaitExactly(f -> f.doneSending().contains("r3")).doneSending());
    kit.createTestProbe().expectNoMessage(Duration.ofMillis(400));
    assertTrue(sink.drain().isEmpty(), "freed blocks kept for decode-6, which did not go");
  }

  @Test
  void aReaderThatAttachesAgainUnderItsIdWithinTheGraceKeepsItsBlocks() {
    ActorRef<RequestTrackerActor.Command> t = tracker(SHORT_GRACE);
    t.tell(introduced("decode-5"));
    t.tell(introduced()); // its engine died, never listed here
    t.tell(new RequestTrackerActor.ExpectRelease("r1", "tx1", System.currentTimeMillis() + 120_000,
        "decode-5"));
    t.tell(introduced("decode-5")); // a new incarnation under the same id asks for our metadata
    kit.createTestProbe().expectNoMessage(Duration.ofMillis(500));
    assertTrue(sink.drain().isEmpty(), "freed blocks the new incarnation may read");
    t.tell(new RequestTrackerActor.Released("tx1"));
    assertEquals(Set.of("r1"), awaitExactly(f -> f.doneSending().contains("r1")).doneSending());
  }

  @Test
  void aReaderWhoseIntroducedWorkersStopWhileTheListingShowsItKeepsItsBlocks() {
    ActorRef<RequestTrackerActor.Command> t = tracker(SHORT_GRACE);
    // Its workers stopped, but the listing shows the engine (another incarnation, or the listing
    // has not dropped it yet): the listing says when it goes.
    listDecodeZero(t);
    t.tell(introduced("decode-0"));
    t.tell(new RequestTrackerActor.ExpectRelease("r1", "tx1", System.currentTimeMillis() + 120_000,
        "decode-0"));
    t.tell(introduced());
    kit.createTestProbe().expectNoMessage(Duration.ofMillis(500));
    assertTrue(sink.drain().isEmpty(), "freed blocks a listed reader may still read");
  }
}
