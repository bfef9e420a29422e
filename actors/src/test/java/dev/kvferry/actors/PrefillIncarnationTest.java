package dev.kvferry.actors;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvferry.actors.connector.ConnectorWorker;
import dev.kvferry.actors.connector.Finished;
import dev.kvferry.actors.connector.ReqMeta;
import dev.kvferry.actors.connector.Role;
import dev.kvferry.actors.connector.TransferMode;
import dev.kvferry.actors.engine.ConnectorSettings;
import dev.kvferry.actors.engine.EngineIdentity;
import java.time.Duration;
import java.util.Set;
import java.util.concurrent.TimeUnit;
import org.apache.pekko.actor.testkit.typed.javadsl.FishingOutcomes;
import org.apache.pekko.actor.typed.ActorRef;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;

/**
 * D's receive when the P worker it told its blocks stops while P's engine stays listed (it
 * detached and attached again under its id): the new incarnation is told the blocks, and its
 * WriteDone completes the receive, instead of the receive waiting for its deadline.
 */
class PrefillIncarnationTest {

  private static final Duration WITHIN = Duration.ofSeconds(10);

  private final PeerFixture fx = new PeerFixture();
  private final EngineIdentity prefill =
      new EngineIdentity(Role.PREFILL, "prefill-0", 0, 1, 0, 1, TransferMode.WRITE);

  @AfterEach
  void stop() {
    fx.close();
  }

  private PeerProtocol.RemoteBlocks nextBlocks() {
    return (PeerProtocol.RemoteBlocks) fx.peerInbox.fishForMessage(WITHIN,
        m -> m instanceof PeerProtocol.RemoteBlocks
            ? FishingOutcomes.complete() : FishingOutcomes.continueAndIgnore()).get(0);
  }

  /** D announces {@code blocks} of request {@code id} ("tx-" + id) to a listed P worker. */
  private ConnectorWorker announced(String id, int[] blocks) {
    fx.awaitListed(Role.PREFILL, "prefill-0");
    ConnectorWorker d = fx.worker(Role.DECODE, TransferMode.WRITE, "decode-0",
        ConnectorSettings.DEFAULTS);
    d.engineRef().tell(new EngineActor.AnnounceRemoteBlocks(
        new ReqMeta(id, "tx-" + id, blocks, null, "prefill-0", 0)));
    assertEquals("tx-" + id, nextBlocks().transferId());
    return d;
  }

  @Test
  void blocksToldToAPrefillWorkerThatStopsAreToldToItsNextIncarnation() {
    ActorRef<EngineActor.Command> old = fx.startPeer(prefill, fx::peerMetadata);
    ConnectorWorker d = announced("r1", new int[] {5, 2});

    // The engine attaches again: its new worker is listed beside the old one, then the old stops.
    fx.startPeerUnder("again", prefill, fx::peerMetadata);
    // Its registration is asynchronous: stopped before it is listed, the old worker would leave
    // the engine unlisted for a moment, and D rightly ends a receive whose P engine left.
    fx.awaitListed(Role.PREFILL, "prefill-0", 2);
    fx.kit.stop(old);
    PeerProtocol.RemoteBlocks again = nextBlocks();
    assertEquals("tx-r1", again.transferId());
    assertArrayEquals(new int[] {5, 2}, again.blockIds());
    fx.peerInbox.expectNoMessage(Duration.ofMillis(300)); // told once, not on every listing

    d.engineRef().tell(new PeerProtocol.WriteDone("tx-r1", "prefill-0", 0));
    Finished f = fx.awaitFinished(d, x -> x.doneReceiving().contains("r1"));
    assertTrue(f.failed().isEmpty(), f.toString());
  }

  @Test
  void aPrefillEngineUnlistedForAMomentWhileAttachingAgainKeepsItsReceive() {
    // The order a real engine attaching again has: its old worker stops (and its entry goes)
    // before the new one registers. The engine lingers as listed over that moment.
    ActorRef<EngineActor.Command> old = fx.startPeer(prefill, fx::peerMetadata);
    ConnectorWorker d = announced("r3", new int[] {4, 1});

    fx.kit.stop(old);
    fx.awaitUnlisted(Role.PREFILL, "prefill-0"); // no worker of P's listed for a moment
    fx.startPeerUnder("again", prefill, fx::peerMetadata);
    PeerProtocol.RemoteBlocks again = nextBlocks();
    assertEquals("tx-r3", again.transferId());
    assertArrayEquals(new int[] {4, 1}, again.blockIds());

    d.engineRef().tell(new PeerProtocol.WriteDone("tx-r3", "prefill-0", 0));
    Finished f = fx.awaitFinished(d, x -> x.doneReceiving().contains("r3") || !x.failed().isEmpty());
    assertTrue(f.failed().isEmpty(), f.toString());
    assertEquals(Set.of("r3"), f.doneReceiving());
  }

  @Test
  void aWorkerRegisteredAgainRightAfterItsStopCompletedGetsItsName() throws Exception {
    // Its parent frees the actor name after the stop's watch saw the old worker terminate: the
    // next registration waits that moment out instead of failing "name not unique".
    for (int attach = 0; attach < 50; attach++) {
      ConnectorWorker w = fx.worker(Role.PREFILL, TransferMode.WRITE, "prefill-again",
          ConnectorSettings.DEFAULTS);
      w.stop().get(10, TimeUnit.SECONDS);
    }
  }

  @Test
  void aWorkerThatStopsWithNoNextIncarnationEndsTheReceiveWhenItsEngineLeaves() {
    ActorRef<EngineActor.Command> old = fx.startPeer(prefill, fx::peerMetadata);
    ConnectorWorker d = announced("r2", new int[] {3});

    fx.kit.stop(old); // nobody attaches again: the listing drops the engine
    Finished f = fx.awaitFinished(d, x -> x.failed().containsKey("r2"));
    assertTrue(f.failed().get("r2").contains("left the cluster"), f.toString());
    assertTrue(f.doneReceiving().isEmpty(), f.toString());
  }
}
