package dev.kvferry.actors;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvferry.actors.connector.Role;
import dev.kvferry.actors.connector.TransferMode;
import dev.kvferry.actors.engine.AgentMetadata;
import dev.kvferry.actors.engine.ConnectorSettings;
import dev.kvferry.actors.engine.EngineDirectory;
import dev.kvferry.actors.engine.EngineIdentity;
import dev.kvferry.rdma.RegionDescriptor;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.atomic.AtomicInteger;
import org.apache.pekko.actor.testkit.typed.javadsl.TestProbe;
import org.apache.pekko.actor.typed.ActorRef;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;

/** The HandshakeActor on its own: deduplication, caching, retries, failure to every waiter. */
class HandshakeActorTest {

  private final PeerFixture fx = new PeerFixture();
  private final EngineIdentity self =
      new EngineIdentity(Role.PREFILL, "prefill-0", 0, 1, 0, 1, TransferMode.WRITE);
  private final EngineIdentity peer =
      new EngineIdentity(Role.DECODE, "decode-0", 0, 1, 0, 1, TransferMode.WRITE);

  @AfterEach
  void stop() {
    fx.close();
  }

  private ActorRef<HandshakeActor.Command> handshake(ConnectorSettings settings) {
    return handshake(settings, null);
  }

  private ActorRef<HandshakeActor.Command> handshake(ConnectorSettings settings,
      ActorRef<EngineActor.Command> owner) {
    List<RegionDescriptor> layers = new ArrayList<>();
    fx.localLayers.forEach(r -> layers.add(fx.transport.describe(r)));
    AgentMetadata local = new AgentMetadata(self.engineId(), 0, 0, 1, fx.transport.name(),
        PeerFixture.GEOMETRY, layers);
    return fx.kit.spawn(HandshakeActor.create(local, settings, owner));
  }

  @Test
  void oneFetchServesAHundredConcurrentWaitersAndIsCached() {
    AtomicInteger asked = new AtomicInteger();
    ActorRef<EngineActor.Command> peerRef = fx.startPeer(peer, p -> {
      asked.incrementAndGet();
      return fx.peerMetadata(p);
    });
    ActorRef<HandshakeActor.Command> h = handshake(ConnectorSettings.DEFAULTS);
    h.tell(new HandshakeActor.DirectoryChanged(EngineDirectory.of(List.of(peerRef))));
    List<TestProbe<HandshakeActor.Result>> waiters = new ArrayList<>();
    for (int i = 0; i < 100; i++) {
      TestProbe<HandshakeActor.Result> w = fx.kit.createTestProbe();
      waiters.add(w);
      h.tell(new HandshakeActor.Fetch("decode-0", 0, w.ref()));
    }
    for (TestProbe<HandshakeActor.Result> w : waiters) {
      HandshakeActor.Result r = w.receiveMessage(Duration.ofSeconds(5));
      assertInstanceOf(HandshakeActor.Ready.class, r);
    }
    TestProbe<HandshakeActor.Result> late = fx.kit.createTestProbe();
    h.tell(new HandshakeActor.Fetch("decode-0", 0, late.ref()));
    assertInstanceOf(HandshakeActor.Ready.class, late.receiveMessage(Duration.ofSeconds(5)));
    assertEquals(1, asked.get(), "the peer was asked more than once");
  }

  @Test
  void aPeerThatNeverAnswersFailsEveryWaiterAfterTheLastAttemptNamingIt() {
    AtomicInteger asked = new AtomicInteger();
    ActorRef<EngineActor.Command> peerRef = fx.startPeer(peer, p -> {
      asked.incrementAndGet();
      return null; // never answers
    });
    ConnectorSettings s = ConnectorSettings.DEFAULTS.withHandshake(
        Duration.ofMillis(200), 3, Duration.ofMillis(50));
    ActorRef<HandshakeActor.Command> h = handshake(s);
    h.tell(new HandshakeActor.DirectoryChanged(EngineDirectory.of(List.of(peerRef))));
    List<TestProbe<HandshakeActor.Result>> waiters = new ArrayList<>();
    for (int i = 0; i < 10; i++) {
      TestProbe<HandshakeActor.Result> w = fx.kit.createTestProbe();
      waiters.add(w);
      h.tell(new HandshakeActor.Fetch("decode-0", 0, w.ref()));
    }
    for (TestProbe<HandshakeActor.Result> w : waiters) {
      HandshakeActor.Failed f =
          assertInstanceOf(HandshakeActor.Failed.class, w.receiveMessage(Duration.ofSeconds(5)));
      assertTrue(f.reason().contains("decode-0") && f.reason().contains("3 attempts"), f.reason());
    }
    assertEquals(3, asked.get(), "one request per attempt, however many waiters");
  }

  @Test
  void anEngineThatIsNotListedFailsAfterTheAttemptsSayingSo() {
    ConnectorSettings s = ConnectorSettings.DEFAULTS.withHandshake(
        Duration.ofMillis(100), 2, Duration.ofMillis(20));
    ActorRef<HandshakeActor.Command> h = handshake(s);
    TestProbe<HandshakeActor.Result> w = fx.kit.createTestProbe();
    h.tell(new HandshakeActor.Fetch("nobody", 0, w.ref()));
    HandshakeActor.Failed f =
        assertInstanceOf(HandshakeActor.Failed.class, w.receiveMessage(Duration.ofSeconds(5)));
    assertTrue(f.reason().contains("nobody") && f.reason().contains("not a member"), f.reason());
  }

  @Test
  void servesItsOwnMetadataToPeers() {
    ActorRef<HandshakeActor.Command> h = handshake(ConnectorSettings.DEFAULTS);
    TestProbe<PeerProtocol.MetadataReply> p = fx.kit.createTestProbe();
    h.tell(new HandshakeActor.Serve(new PeerProtocol.GetMetadata(p.ref())));
    PeerProtocol.MetadataReply reply = p.receiveMessage(Duration.ofSeconds(5));
    assertEquals("prefill-0", reply.engineId());
    assertTrue(reply.blob().length > 0);
  }

  /** A peer worker serving its metadata, counting how often it is asked. */
  private ActorRef<EngineActor.Command> countingPeer(AtomicInteger asked) {
    return fx.startPeer(peer, p -> {
      asked.incrementAndGet();
      return fx.peerMetadata(p);
    });
  }

  /** Lists {@code worker} alone and fetches its metadata (any incarnation) through {@code h}. */
  private HandshakeActor.Ready listAndFetch(ActorRef<HandshakeActor.Command> h,
      ActorRef<EngineActor.Command> worker, TestProbe<HandshakeActor.Result> w) {
    h.tell(new HandshakeActor.DirectoryChanged(EngineDirectory.of(List.of(worker))));
    h.tell(new HandshakeActor.Fetch("decode-0", 0, w.ref()));
    return assertInstanceOf(HandshakeActor.Ready.class, w.receiveMessage(Duration.ofSeconds(5)));
  }

  @Test
  void aWorkerRestartedUnderTheSameIdIsAskedAgainNotServedItsOldMetadata() {
    ActorRef<EngineActor.Command> old = countingPeer(new AtomicInteger());
    ActorRef<HandshakeActor.Command> h = handshake(ConnectorSettings.DEFAULTS);
    TestProbe<HandshakeActor.Result> w = fx.kit.createTestProbe();
    HandshakeActor.Ready first = listAndFetch(h, old, w);

    // The engine restarts with its regions elsewhere; the listing goes from the old incarnation
    // to the new one with no gap in between.
    fx.kit.stop(old);
    AtomicInteger askedNew = new AtomicInteger();
    ActorRef<EngineActor.Command> restarted = fx.startPeer(peer, p -> {
      askedNew.incrementAndGet();
      List<RegionDescriptor> moved = new ArrayList<>();
      for (int l = fx.peerLayers.size() - 1; l >= 0; l--) {
        moved.add(fx.transport.describe(fx.peerLayers.get(l)));
      }
      return new AgentMetadata(p.engineId(), 0, 0, 1, fx.transport.name(), PeerFixture.GEOMETRY,
          moved).pack();
    });
    HandshakeActor.Ready second = listAndFetch(h, restarted, w);
    assertEquals(1, askedNew.get(), "the new incarnation was not asked");
    assertEquals(first.metadata().layers().get(1).regionId(),
        second.metadata().layers().get(0).regionId(), "served the old incarnation's regions");
  }

  /**
   * READ: D asks for the incarnation P's params name. While the directory still lists the old one
   * (it stopped, the listing has not caught up) the fetch waits and the old one is not asked;
   * once the named one is listed it is asked.
   */
  @Test
  void aFetchForANamedIncarnationWaitsWhileAnotherIsListed() {
    AtomicInteger askedOld = new AtomicInteger();
    ActorRef<EngineActor.Command> old = countingPeer(askedOld);
    ActorRef<HandshakeActor.Command> h = handshake(ConnectorSettings.DEFAULTS);
    listAndFetch(h, old, fx.kit.createTestProbe());

    fx.kit.stop(old);
    AtomicInteger askedNew = new AtomicInteger();
    ActorRef<EngineActor.Command> next = countingPeer(askedNew);
    TestProbe<HandshakeActor.Result> named = fx.kit.createTestProbe();
    h.tell(new HandshakeActor.Fetch("decode-0", 0, next.path().uid(), named.ref()));
    named.expectNoMessage(Duration.ofMillis(300)); // the old one is still listed: not it
    assertEquals(1, askedOld.get(), "the listed old incarnation was asked for the new one");
    h.tell(new HandshakeActor.DirectoryChanged(EngineDirectory.of(List.of(next))));
    assertInstanceOf(HandshakeActor.Ready.class, named.receiveMessage(Duration.ofSeconds(5)));
    assertEquals(1, askedNew.get());
  }

  @Test
  void aNamedIncarnationThatIsNeverListedFailsSayingWhichIsListed() {
    ActorRef<EngineActor.Command> listed = fx.startPeer(peer, fx::peerMetadata);
    ConnectorSettings s = ConnectorSettings.DEFAULTS.withHandshake(
        Duration.ofMillis(100), 2, Duration.ofMillis(20));
    ActorRef<HandshakeActor.Command> h = handshake(s);
    h.tell(new HandshakeActor.DirectoryChanged(EngineDirectory.of(List.of(listed))));
    TestProbe<HandshakeActor.Result> w = fx.kit.createTestProbe();
    int gone = listed.path().uid() + 1;
    h.tell(new HandshakeActor.Fetch("decode-0", 0, gone, w.ref()));
    HandshakeActor.Failed f =
        assertInstanceOf(HandshakeActor.Failed.class, w.receiveMessage(Duration.ofSeconds(5)));
    assertTrue(f.reason().contains("uid " + gone) && f.reason().contains("is not listed"),
        f.reason());
  }

  @Test
  void aPeerThatLeavesIsReportedSoItsTransportStateIsReleased() {
    ActorRef<EngineActor.Command> peerRef = fx.startPeer(peer, fx::peerMetadata);
    TestProbe<EngineActor.Command> owner = fx.kit.createTestProbe();
    ActorRef<HandshakeActor.Command> h = handshake(ConnectorSettings.DEFAULTS, owner.ref());
    h.tell(new HandshakeActor.DirectoryChanged(EngineDirectory.of(List.of(peerRef))));
    TestProbe<HandshakeActor.Result> w = fx.kit.createTestProbe();
    h.tell(new HandshakeActor.Fetch("decode-0", 0, w.ref()));
    assertInstanceOf(HandshakeActor.Ready.class, w.receiveMessage(Duration.ofSeconds(5)));

    h.tell(new HandshakeActor.DirectoryChanged(EngineDirectory.EMPTY));
    EngineActor.PeerGone gone =
        owner.expectMessageClass(EngineActor.PeerGone.class, Duration.ofSeconds(5));
    assertEquals("decode-0", gone.metadata().engineId());
    assertEquals(PeerFixture.LAYERS, gone.metadata().layers().size());
  }

  @Test
  void servingOurMetadataIntroducesTheAskingWorkerToTheOwner() {
    TestProbe<EngineActor.Command> owner = fx.kit.createTestProbe();
    ActorRef<HandshakeActor.Command> h = handshake(ConnectorSettings.DEFAULTS, owner.ref());
    TestProbe<PeerProtocol.MetadataReply> replies = fx.kit.createTestProbe();
    ActorRef<EngineActor.Command> worker =
        fx.kit.spawn(org.apache.pekko.actor.typed.javadsl.Behaviors.empty(), peer.toActorName());
    h.tell(new HandshakeActor.Serve(new PeerProtocol.GetMetadata(replies.ref(), worker)));
    assertEquals("prefill-0", replies.receiveMessage(Duration.ofSeconds(5)).engineId());
    EngineActor.PeerIntroduced hi =
        owner.expectMessageClass(EngineActor.PeerIntroduced.class, Duration.ofSeconds(5));
    assertEquals("decode-0", hi.engineId());
    assertEquals(worker, hi.worker());

    // Anonymous, or an asker whose name is no engine worker's: served, introduced as nothing.
    ActorRef<EngineActor.Command> stranger =
        fx.kit.spawn(org.apache.pekko.actor.typed.javadsl.Behaviors.empty(), "not-a-worker");
    h.tell(new HandshakeActor.Serve(new PeerProtocol.GetMetadata(replies.ref())));
    h.tell(new HandshakeActor.Serve(new PeerProtocol.GetMetadata(replies.ref(), stranger)));
    replies.receiveMessage(Duration.ofSeconds(5));
    replies.receiveMessage(Duration.ofSeconds(5));
    owner.expectNoMessage(Duration.ofMillis(300));
  }
}
