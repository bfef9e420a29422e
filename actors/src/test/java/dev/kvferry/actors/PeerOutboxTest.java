package dev.kvferry.actors;

import static org.junit.jupiter.api.Assertions.assertEquals;

import dev.kvferry.actors.connector.Role;
import dev.kvferry.actors.connector.TransferMode;
import dev.kvferry.actors.engine.ConnectorSettings;
import dev.kvferry.actors.engine.EngineDirectory;
import dev.kvferry.actors.engine.EngineIdentity;
import java.time.Duration;
import java.util.List;
import org.apache.pekko.actor.testkit.typed.javadsl.ActorTestKit;
import org.apache.pekko.actor.testkit.typed.javadsl.TestProbe;
import org.apache.pekko.actor.typed.ActorRef;
import org.apache.pekko.actor.typed.javadsl.Behaviors;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;
import org.slf4j.LoggerFactory;

/** What an actor sends to peer workers: held until the worker (and incarnation) is listed. */
class PeerOutboxTest {

  private final ActorTestKit kit = ActorTestKit.create();
  private final EngineIdentity prefill =
      new EngineIdentity(Role.PREFILL, "prefill-0", 0, 1, 0, 1, TransferMode.READ);

  @AfterEach
  void stop() {
    kit.shutdownTestKit();
  }

  /** A worker under the engine's actor name that forwards what it gets to {@code probe}. */
  private ActorRef<EngineActor.Command> incarnation(TestProbe<EngineActor.Command> probe) {
    return kit.spawn(Behaviors.<EngineActor.Command>receiveMessage(m -> {
      probe.ref().tell(m);
      return Behaviors.same();
    }), prefill.toActorName());
  }

  @Test
  void blocksDroppedForAnUnlistedWorkerMayBeAnsweredThroughTheOutboxAndReachItOnceListed() {
    // Found in CI: D's receiver, ending a receive, sent P "abandoned" from inside drop's callback
    // while drop walked the held messages; the ConcurrentModificationException stopped the
    // receiver, and D's request hung.
    PeerOutbox outbox = new PeerOutbox(LoggerFactory.getLogger(PeerOutboxTest.class),
        ConnectorSettings.DEFAULTS);
    for (int i = 0; i < 15; i++) { // a full deque: what the callback adds makes it grow
      outbox.send("prefill-9", 0, new PeerProtocol.Release("tx-other-" + i, "decode-0", 0, 1));
    }
    outbox.send("prefill-0", 0,
        new PeerProtocol.RemoteBlocks("tx-2", "r2", new int[] {1}, "decode-0", 0, 0));
    PeerProtocol.TransferFailed abandoned =
        new PeerProtocol.TransferFailed("tx-2", "decode-0", "request r2 aborted", 0);
    outbox.drop("tx-2", peer -> outbox.send(peer.engineId(), peer.tpRank(), abandoned));
    TestProbe<EngineActor.Command> probe = kit.createTestProbe();
    outbox.replaceDirectory(EngineDirectory.of(List.of(incarnation(probe))));
    outbox.flush();
    assertEquals(abandoned, probe.receiveMessage(Duration.ofSeconds(5))); // not the blocks
    probe.expectNoMessage(Duration.ofMillis(100));
  }

  @Test
  void workHeldForATransferThatEndsRunsItsDropCallbackButWorkOwedToThePeerStays() {
    PeerOutbox outbox = new PeerOutbox(LoggerFactory.getLogger(PeerOutboxTest.class),
        ConnectorSettings.DEFAULTS);
    List<String> ran = new java.util.ArrayList<>();
    outbox.withTpSizeOf("prefill-0", "tx-3", tp -> ran.add("load with TP " + tp),
        () -> outbox.owedWhenListed("prefill-0", "tx-3", tp -> ran.add("release with TP " + tp)));
    assertEquals(true, outbox.holdsWorkFor("tx-3"));
    outbox.drop("tx-3", peer -> {}); // the transfer ends: the load goes, its release is owed
    assertEquals(false, outbox.holdsWorkFor("tx-3"), "owed work is no work of the transfer's");
    outbox.drop("tx-3", peer -> {}); // a second ending (P's failure after our abort) keeps it
    TestProbe<EngineActor.Command> probe = kit.createTestProbe();
    outbox.replaceDirectory(EngineDirectory.of(List.of(incarnation(probe))));
    outbox.flush();
    assertEquals(List.of("release with TP 1"), ran);
  }

  @Test
  void theOldestHeldWorkDroppedForRoomStillLeavesWhatItOwesAndTakesNoOtherWorksPlace() {
    // Room for two: a third load drops the first, whose release is then owed; that release must
    // not push the two loads still held out in turn.
    ConnectorSettings d = ConnectorSettings.DEFAULTS;
    PeerOutbox outbox = new PeerOutbox(LoggerFactory.getLogger(PeerOutboxTest.class),
        new ConnectorSettings(d.handshakeTimeout(), d.handshakeAttempts(), d.handshakeBackoff(),
            d.deferTimeout(), d.transferTimeout(), d.readAbortTimeout(), 2,
            d.readsAtAdmission(), d.reattachGrace()));
    List<String> ran = new java.util.ArrayList<>();
    for (int i = 1; i <= 3; i++) {
      int n = i;
      outbox.withTpSizeOf("prefill-0", "tx-" + n, tp -> ran.add("load " + n), () ->
          outbox.owedWhenListed("prefill-0", "tx-" + n, tp -> ran.add("release " + n)));
    }
    TestProbe<EngineActor.Command> probe = kit.createTestProbe();
    outbox.replaceDirectory(EngineDirectory.of(List.of(incarnation(probe))));
    outbox.flush();
    assertEquals(List.of("release 1", "load 2", "load 3"), ran);
  }

  @Test
  void aMessageForANamedIncarnationWaitsWhileAnotherIsListed() {
    PeerOutbox outbox = new PeerOutbox(LoggerFactory.getLogger(PeerOutboxTest.class),
        ConnectorSettings.DEFAULTS);
    TestProbe<EngineActor.Command> oldProbe = kit.createTestProbe();
    ActorRef<EngineActor.Command> old = incarnation(oldProbe);
    outbox.replaceDirectory(EngineDirectory.of(List.of(old)));
    kit.stop(old); // stopped; the listing has not caught up yet
    TestProbe<EngineActor.Command> nextProbe = kit.createTestProbe();
    ActorRef<EngineActor.Command> next = incarnation(nextProbe);
    PeerProtocol.Release release = new PeerProtocol.Release("tx-1", "decode-0", 0, 1);

    // Told to the old one, it would be lost (it stopped): held for the named one instead.
    outbox.send("prefill-0", 0, next.path().uid(), release);
    // Not pinned: goes to whichever is listed, the old one here (and is lost with it).
    outbox.send("prefill-0", 0, new PeerProtocol.Release("tx-any", "decode-0", 0, 1));
    nextProbe.expectNoMessage(Duration.ofMillis(200)); // not listed yet: nothing reaches it
    outbox.replaceDirectory(EngineDirectory.of(List.of(next)));
    outbox.flush();
    assertEquals(release, nextProbe.receiveMessage(Duration.ofSeconds(5)));
    nextProbe.expectNoMessage(Duration.ofMillis(100));
    oldProbe.expectNoMessage(Duration.ofMillis(10));
  }
}
