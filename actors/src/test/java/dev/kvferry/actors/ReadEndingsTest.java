package dev.kvferry.actors;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvferry.actors.connector.Finished;
import dev.kvferry.actors.connector.ReqMeta;
import dev.kvferry.actors.connector.Role;
import dev.kvferry.actors.connector.TransferMode;
import dev.kvferry.actors.engine.ConnectorSettings;
import dev.kvferry.actors.engine.EngineDirectory;
import dev.kvferry.actors.engine.EngineIdentity;
import dev.kvferry.actors.engine.TerminalIds;
import dev.kvferry.rdma.TransferStatus;
import java.time.Duration;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import org.apache.pekko.actor.testkit.typed.javadsl.ActorTestKit;
import org.apache.pekko.actor.testkit.typed.javadsl.TestProbe;
import org.apache.pekko.actor.typed.javadsl.Behaviors;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;
import org.slf4j.LoggerFactory;

/**
 * How D's reads end, driven on the test's thread as the reader drives them on its own: the cases
 * an actor test cannot order, such as an abort handled before the reader's own messages about its
 * last reads, which the thread completing those reads already reported to the engine.
 */
class ReadEndingsTest {

  private static final Duration QUIET = Duration.ofMillis(200);

  private final ActorTestKit kit = ActorTestKit.create();
  private final EngineIdentity decode =
      new EngineIdentity(Role.DECODE, "decode-0", 0, 1, 0, 1, TransferMode.READ);
  private final EngineIdentity prefill =
      new EngineIdentity(Role.PREFILL, "prefill-0", 0, 1, 0, 1, TransferMode.READ);
  private final TestProbe<RequestTrackerActor.Command> tracker = kit.createTestProbe();
  private final TestProbe<EngineActor.Command> pWorker = kit.createTestProbe();
  private final Map<String, ReadJob> reads = new HashMap<>();
  private final TerminalIds ended = new TerminalIds(64);
  private final FinishedSink sink = new FinishedSink();
  private final PeerOutbox outbox =
      new PeerOutbox(LoggerFactory.getLogger(ReadEndingsTest.class), ConnectorSettings.DEFAULTS);
  private final ReadEndings endings =
      new ReadEndings(decode, reads, ended, tracker.ref(), outbox, sink);

  ReadEndingsTest() {
    // P's worker, listed under its engine's actor name: what D sends it reaches pWorker.
    outbox.replaceDirectory(EngineDirectory.of(List.of(kit.spawn(
        Behaviors.<EngineActor.Command>receiveMessage(m -> {
          pWorker.ref().tell(m);
          return Behaviors.same();
        }), prefill.toActorName()))));
  }

  @AfterEach
  void stop() {
    kit.shutdownTestKit();
  }

  /** A read of {@code layers} layers from P's one worker, set up as the reader sets one up. */
  private ReadJob read(String transferId, String requestId, int layers) {
    ReqMeta r = new ReqMeta(requestId, transferId, new int[] {4, 5}, new int[] {7, 9},
        prefill.engineId(), 0);
    ReadJob job = new ReadJob(r, new int[] {0}, layers);
    reads.put(transferId, job);
    sink.expectEarlyDone(transferId, requestId);
    return job;
  }

  private void assertReleased(String transferId) {
    assertEquals(endings.release(transferId), pWorker.receiveMessage(Duration.ofSeconds(5)));
    pWorker.expectNoMessage(QUIET);
  }

  @Test
  void anAbortHandledBeforeTheLastReadsMessagesEndsAReadReportedDoneAsASuccess() {
    ReadJob job = read("tx-1", "r1", 2);
    job.landed(sink, TransferStatus.succeeded(1000), null);
    job.landed(sink, TransferStatus.succeeded(24), null); // the last: reported on this thread
    assertEquals(Set.of("r1"), sink.drain().doneReceiving());

    endings.endTransfer("tx-1", "request r1 aborted by the engine");

    // The engine acted on the done: the tracker hears a success, and P frees its blocks once.
    assertEquals(new RequestTrackerActor.ReceiveSucceeded("tx-1", 1024),
        tracker.receiveMessage(Duration.ofSeconds(5)));
    tracker.expectNoMessage(QUIET);
    assertReleased("tx-1");
    assertFalse(reads.containsKey("tx-1"));
    assertTrue(ended.contains("tx-1"), "its id reads nothing again");
    assertEquals(Finished.NONE, sink.drain(), "nothing more for the engine from the ending");

  }

  @Test
  void aReadEndedWithReadsInFlightReportsItsFirstReasonOnlyOnceNoneCanStillLand() {
    ReadJob job = read("tx-2", "r2", 2);
    job.inFlight = 2; // handed to the transport: they may still land in D's blocks
    endings.endTransfer("tx-2", "request r2 aborted by the engine");
    endings.endTransfer("tx-2", "prefill engine prefill-0 failed");
    tracker.expectNoMessage(QUIET);
    pWorker.expectNoMessage(Duration.ofMillis(50));
    assertTrue(job.cancelled.get(), "no read of it starts any more");

    // Both land after the ending: the engine is not told of a done, it was promised the failure.
    job.landed(sink, TransferStatus.succeeded(512), null);
    job.landed(sink, TransferStatus.succeeded(512), null);
    assertFalse(sink.doneEarly("tx-2"));
    assertEquals(Finished.NONE, sink.drain());

    job.inFlight = 0; // the reader heard of the last one
    endings.endRead(job, "its last read finished");
    assertEquals(new RequestTrackerActor.TransferFailed("tx-2", "request r2 aborted by the engine"),
        tracker.receiveMessage(Duration.ofSeconds(5)));
    assertReleased("tx-2");
    assertTrue(ended.contains("tx-2"));
  }

  @Test
  void aReadWhoseLastReadFailedIsNotReportedDoneAndEndsAsAFailure() {
    ReadJob job = read("tx-3", "r3", 2);
    job.landed(sink, TransferStatus.succeeded(512), null);
    job.landed(sink, TransferStatus.failed("copy engine fault"), null);
    assertFalse(endings.settleIfDoneEarly(job), "one read failed: nothing was reported done");

    endings.endRead(job, "read of layer 1 failed: copy engine fault");
    assertEquals(
        new RequestTrackerActor.TransferFailed("tx-3", "read of layer 1 failed: copy engine fault"),
        tracker.receiveMessage(Duration.ofSeconds(5)));
    assertReleased("tx-3");
  }

  @Test
  void anEndingForAReadNeverSetUpHereFailsItAtOnceAndOwesPNothing() {
    endings.endTransfer("tx-4", "prefill engine prefill-0 left the cluster");
    assertEquals(
        new RequestTrackerActor.TransferFailed("tx-4", "prefill engine prefill-0 left the cluster"),
        tracker.receiveMessage(Duration.ofSeconds(5)));
    pWorker.expectNoMessage(QUIET);
  }
}
