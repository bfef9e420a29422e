package dev.kvferry.actors;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvferry.actors.connector.ConnectorMetadata;
import dev.kvferry.actors.connector.ConnectorRequest;
import dev.kvferry.actors.connector.ConnectorScheduler;
import dev.kvferry.actors.connector.ConnectorWorker;
import dev.kvferry.actors.connector.FinishDecision;
import dev.kvferry.actors.connector.Finished;
import dev.kvferry.actors.connector.HostLayerEvent;
import dev.kvferry.actors.connector.KvTransferParams;
import dev.kvferry.actors.connector.ReqMeta;
import dev.kvferry.actors.connector.Role;
import dev.kvferry.actors.connector.TransferMode;
import dev.kvferry.actors.engine.ConnectorSettings;
import dev.kvferry.actors.engine.EngineIdentity;
import java.time.Clock;
import java.time.Duration;
import java.util.List;
import java.util.Set;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import org.apache.pekko.actor.testkit.typed.javadsl.FishingOutcomes;
import org.apache.pekko.actor.typed.ActorRef;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;

/**
 * The block-lifetime rule of DESIGN.md section 3: a block lent to a transfer goes back to its
 * engine only when no copy into or out of it can still happen and the peer confirmed the end (or
 * left the cluster). Timeouts and aborts ask the peer to end the transfer; they free nothing.
 */
class BlockLifetimeTest {

  private static final Duration WITHIN = Duration.ofSeconds(10);
  private static final Duration QUIET = Duration.ofMillis(500);

  private final PeerFixture fx = new PeerFixture();
  private final EngineIdentity prefill =
      new EngineIdentity(Role.PREFILL, "prefill-0", 0, 1, 0, 1, TransferMode.WRITE);
  private final EngineIdentity decode =
      new EngineIdentity(Role.DECODE, "decode-0", 0, 1, 0, 1, TransferMode.WRITE);

  @AfterEach
  void stop() {
    fx.close();
  }

  private <T> T fishPeer(Class<T> type) {
    return type.cast(fx.peerInbox.fishForMessage(WITHIN,
        m -> type.isInstance(m) ? FishingOutcomes.complete() : FishingOutcomes.continueAndIgnore())
        .get(0));
  }

  /** A READ decode worker copying through {@code gated}, reading from a listed prefill-0. */
  private ConnectorWorker readingDecode(GatedTransport gated, ConnectorSettings s) {
    listedPrefillPeer(new EngineIdentity(Role.PREFILL, "prefill-0", 0, 1, 0, 1, TransferMode.READ));
    return fx.worker(Role.DECODE, TransferMode.READ, "decode-0", s, gated, fx.localLayers);
  }

  /**
   * A WRITE prefill worker copying through {@code gated} to a listed decode-0, with every layer
   * of its block 1 saved for D's block 3 and each layer's write submitted (held by the gate).
   */
  private ConnectorWorker prefillWritingThroughGate(GatedTransport gated, String requestId,
      String transferId) {
    fx.startPeer(decode, fx::peerMetadata);
    fx.awaitListed(Role.DECODE, "decode-0");
    ConnectorWorker p = fx.worker(Role.PREFILL, TransferMode.WRITE, "prefill-0",
        ConnectorSettings.DEFAULTS, gated, fx.localLayers);
    p.engineRef().tell(
        new PeerProtocol.RemoteBlocks(transferId, requestId, new int[] {3}, "decode-0", 0, 0));
    PeerFixture.saveAllLayers(
        p, new ReqMeta(requestId, transferId, new int[] {1}, null, "decode-0", 0));
    awaitSubmitted(gated, PeerFixture.LAYERS);
    return p;
  }

  /**
   * The engine hands {@code d} a read of {@code prefill}'s blocks 3 and 4, held while that engine
   * is not listed, then aborts it: the request is reported failed as aborted.
   */
  private void abortLoadFromUnlistedPrefill(ConnectorWorker d, String requestId, String transferId,
      String prefill) {
    d.startLoadKv(new ConnectorMetadata(List.of(),
        List.of(new ReqMeta(requestId, transferId, new int[] {1, 2}, new int[] {3, 4}, prefill, 0)),
        List.of()));
    TrackedTransfers.assertCount(fx, d, 1); // held: P's TP size is not known yet
    d.engineRef().tell(new EngineActor.AbortReceive(requestId, transferId,
        "request " + requestId + " aborted"));
    assertTrue(fx.awaitFinished(d, x -> x.failed().containsKey(requestId)).failed().get(requestId)
        .contains("aborted"));
  }

  /**
   * A READ decode (through {@code gated}) handed one read of prefill-0's blocks 3 and 4 into its
   * blocks 1 and 2, with every layer's read submitted and held at the gate.
   */
  private ConnectorWorker readHeldAtTheGate(GatedTransport gated, ConnectorSettings s,
      String requestId, String transferId) {
    ConnectorWorker d = readingDecode(gated, s);
    loadFromPrefill(d, requestId, transferId, new int[] {1, 2});
    awaitSubmitted(gated, PeerFixture.LAYERS);
    return d;
  }

  /** The engine hands {@code d} one read of prefill-0's blocks 3 and 4 into {@code blocks}. */
  private static void loadFromPrefill(ConnectorWorker d, String requestId, String transferId,
      int[] blocks) {
    d.startLoadKv(new ConnectorMetadata(List.of(),
        List.of(new ReqMeta(requestId, transferId, blocks, new int[] {3, 4}, "prefill-0", 0)),
        List.of()));
  }

  /** {@code w} reports nothing for a while (its blocks stay with the transfer). */
  private void assertNothingFinishedFor(ConnectorWorker w, Duration quiet) {
    fx.kit.createTestProbe().expectNoMessage(quiet);
    Finished f = w.getFinished();
    assertTrue(f.isEmpty(), "reported before the transfer ended: " + f);
  }

  private ActorRef<EngineActor.Command> listedPrefillPeer(EngineIdentity p) {
    ActorRef<EngineActor.Command> ref = fx.startPeer(p, fx::peerMetadata);
    fx.awaitListed(Role.PREFILL, p.engineId());
    return ref;
  }

  private void awaitSubmitted(GatedTransport t, int copies) {
    fx.kit.createTestProbe().awaitAssert(WITHIN, () -> {
      assertEquals(copies, t.submitted());
      return null;
    });
  }

  @Test
  void decodeTimeoutAsksPrefillToAbandonAndFreesOnlyWhenPrefillConfirms() {
    listedPrefillPeer(prefill);
    ConnectorWorker d = fx.worker(Role.DECODE, TransferMode.WRITE, "decode-0",
        ConnectorSettings.DEFAULTS.withTransferTimeout(Duration.ofMillis(300)));
    d.engineRef().tell(new EngineActor.AnnounceRemoteBlocks(
        new ReqMeta("r1", "tx1", new int[] {1, 2}, null, "prefill-0", 0)));
    assertEquals("tx1", fishPeer(PeerProtocol.RemoteBlocks.class).transferId());

    PeerProtocol.TransferFailed ask = fishPeer(PeerProtocol.TransferFailed.class);
    assertEquals("tx1", ask.transferId());
    assertTrue(ask.reason().contains("did not finish within 300 ms"), ask.reason());
    assertNothingFinishedFor(d, QUIET);

    d.engineRef().tell(new PeerProtocol.TransferFailed("tx1", "prefill-0", "abandoned", 0));
    Finished f = fx.awaitFinished(d, x -> x.failed().containsKey("r1"));
    assertTrue(f.failed().get("r1").contains("did not finish within 300 ms"), f.toString());
    assertEquals(Set.of(1, 2), f.blockIdsWithLoadErrors());
  }

  @Test
  void decodeTimeoutFreesWhenPrefillIsDownedInsteadOfConfirming() {
    ActorRef<EngineActor.Command> p = listedPrefillPeer(prefill);
    ConnectorWorker d = fx.worker(Role.DECODE, TransferMode.WRITE, "decode-0",
        ConnectorSettings.DEFAULTS.withTransferTimeout(Duration.ofMillis(300)));
    d.engineRef().tell(new EngineActor.AnnounceRemoteBlocks(
        new ReqMeta("r1", "tx1", new int[] {1, 2}, null, "prefill-0", 0)));
    fishPeer(PeerProtocol.TransferFailed.class);
    assertNothingFinishedFor(d, QUIET);

    fx.kit.stop(p); // leaves the listing, as a downed member does
    assertTrue(fx.awaitFinished(d, x -> x.failed().containsKey("r1")).failed().containsKey("r1"));
  }

  @Test
  void aLateSaveAfterDecodeTimedOutWritesNothingIntoDecodesBlocks() {
    ConnectorSettings s = ConnectorSettings.DEFAULTS.withTransferTimeout(Duration.ofMillis(300));
    ConnectorWorker p = fx.worker(Role.PREFILL, TransferMode.WRITE, "prefill-0", s);
    ConnectorWorker d =
        fx.worker(Role.DECODE, TransferMode.WRITE, "decode-0", s, fx.transport, fx.peerLayers);
    fx.awaitListed(Role.PREFILL, "prefill-0");
    fx.awaitListed(Role.DECODE, "decode-0");
    d.engineRef().tell(new EngineActor.AnnounceRemoteBlocks(
        new ReqMeta("r1", "tx1", new int[] {1, 2}, null, "prefill-0", 0)));
    // P's forward pass is slow: its layers are saved but not computed when D's timeout passes.
    ReqMeta r = new ReqMeta("r1", "tx1", new int[] {5, 6}, null, "decode-0", 0);
    ConnectorMetadata meta = new ConnectorMetadata(List.of(r), List.of(), List.of());
    HostLayerEvent[] events = new HostLayerEvent[PeerFixture.LAYERS];
    for (int l = 0; l < PeerFixture.LAYERS; l++) {
      events[l] = new HostLayerEvent();
      p.saveKvLayer(meta, l, events[l]);
    }
    p.waitForSave();

    assertTrue(fx.awaitFinished(d, x -> x.failed().containsKey("r1")).failed().containsKey("r1"));
    Finished pf = fx.awaitFinished(p, x -> x.doneSending().contains("r1"));
    assertTrue(pf.failed().containsKey("r1"), pf.toString());
    // D's engine has its blocks back (and may reuse them): P's late layers must not land there.
    for (HostLayerEvent e : events) {
      e.fire();
    }
    fx.kit.createTestProbe().expectNoMessage(QUIET);
    assertTrue(fx.peerUntouched(), "a late save wrote into decode blocks already freed");
  }

  @Test
  void decodeRequestAbortedAfterSchedulingKeepsItsBlocksUntilPrefillConfirms() {
    listedPrefillPeer(prefill);
    ConnectorWorker d =
        fx.worker(Role.DECODE, TransferMode.WRITE, "decode-0", ConnectorSettings.DEFAULTS);
    ConnectorScheduler sched = new ConnectorScheduler(Role.DECODE, TransferMode.WRITE, "decode-0",
        0, PeerFixture.BLOCK, List.of(d.engineRef()), ConnectorSettings.DEFAULTS,
        Clock.systemUTC());
    ConnectorRequest req =
        new ConnectorRequest("r2", 8, KvTransferParams.forDecode("tx2", "prefill-0", 0));
    sched.numNewMatchedTokens(req, 0);
    sched.updateStateAfterAlloc(req, new int[] {3, 4}, 8);
    fishPeer(PeerProtocol.RemoteBlocks.class);

    req.setStatus(ConnectorRequest.Status.FINISHED_ABORTED);
    FinishDecision fd = sched.requestFinished(req, new int[] {3, 4});
    assertTrue(fd.delayFreeBlocks(), "P may be writing into the aborted request's blocks");
    PeerProtocol.TransferFailed ask = fishPeer(PeerProtocol.TransferFailed.class);
    assertTrue(ask.reason().contains("aborted on decode engine decode-0"), ask.reason());
    assertNothingFinishedFor(d, QUIET);

    d.engineRef().tell(new PeerProtocol.TransferFailed("tx2", "prefill-0", "abandoned", 0));
    assertTrue(fx.awaitFinished(d, x -> x.failed().containsKey("r2")).failed().containsKey("r2"));
  }

  @Test
  void prefillAbandonedWhileAWriteIsInFlightConfirmsAndFreesOnlyAfterItLanded() {
    GatedTransport gated = new GatedTransport(fx.transport);
    ConnectorWorker p = prefillWritingThroughGate(gated, "r5", "tx5");

    // D gives up while P's copies are in flight: they can still land in D's blocks.
    p.engineRef().tell(new PeerProtocol.TransferFailed("tx5", "decode-0", "decode gave up", 0));
    fx.peerInbox.expectNoMessage(QUIET);
    assertNothingFinishedFor(p, Duration.ZERO);

    gated.open();
    PeerProtocol.TransferFailed confirm = fishPeer(PeerProtocol.TransferFailed.class);
    assertEquals("tx5", confirm.transferId());
    assertEquals(0, confirm.senderTpRank());
    Finished f = fx.awaitFinished(p, x -> x.doneSending().contains("r5"));
    assertTrue(f.failed().get("r5").contains("decode gave up"), f.toString());
  }

  @Test
  void aReadTimeoutFailsClosedOnlyAfterEveryLayerInFlightHasFinished() {
    GatedTransport gated = new GatedTransport(fx.transport);
    ConnectorWorker d = readHeldAtTheGate(gated,
        ConnectorSettings.DEFAULTS.withTransferTimeout(Duration.ofMillis(300)), "r6", "tx6");

    // The timeout passes while both layers' reads are in flight: nothing is freed or released.
    fx.peerInbox.expectNoMessage(Duration.ofMillis(700));
    assertNothingFinishedFor(d, Duration.ZERO);

    gated.open();
    assertEquals("tx6", fishPeer(PeerProtocol.Release.class).transferId());
    Finished f = fx.awaitFinished(d, x -> x.failed().containsKey("r6"));
    assertTrue(f.failed().get("r6").contains("did not finish within 300 ms"), f.toString());
    assertEquals(Set.of(1, 2), f.blockIdsWithLoadErrors());
    assertTrue(f.doneReceiving().isEmpty(), f.toString());
  }

  @Test
  void aReadAbortedBeforeItsLoadReachedTheWorkerReadsNothingIntoTheFreedBlocks() throws Exception {
    GatedTransport gated = new GatedTransport(fx.transport);
    ConnectorWorker d = readingDecode(gated, ConnectorSettings.DEFAULTS);
    // Through the engine port the scheduler and the worker are two connections: the abort of a
    // request the scheduler handed over can reach the worker's actors before the step's load.
    d.engineRef().tell(new EngineActor.AbortReceive("r14", "tx14", "request r14 aborted"));
    Finished f = fx.awaitFinished(d, x -> x.failed().containsKey("r14"));
    assertTrue(f.failed().get("r14").contains("aborted"), f.toString());
    // The engine freed r14's blocks on that report (1 and 2 may hold another request now).
    loadFromPrefill(d, "r14", "tx14", new int[] {1, 2});
    // P is told to free its blocks, nothing is read, and the step's layer waits end.
    assertEquals("tx14", fishPeer(PeerProtocol.Release.class).transferId());
    CompletableFuture<Boolean> waited = CompletableFuture.supplyAsync(() -> {
      try {
        return d.waitForLayerLoad(0);
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
        return false;
      }
    });
    waited.get(WITHIN.toSeconds(), TimeUnit.SECONDS);
    assertNothingFinishedFor(d, QUIET);
    assertEquals(0, gated.submitted(), "a read into blocks the engine already freed");
  }

  @Test
  void prefillConfirmsAnAbandonToTheDecodeRanksItWritesOnceDecodeIsListed() {
    // P rank 1 of TP 2; D (TP 1) asks it to abandon a transfer before D is listed here (it may
    // just have attached). Its confirmation must reach D's rank 0, the one rank it writes: with
    // D's TP size unknown the writer once guessed its own rank 1, which D does not have, and D
    // waited for that confirmation until its engine detached.
    ConnectorWorker p = fx.worker(
        new EngineIdentity(Role.PREFILL, "prefill-0", 0, 1, 1, 2, TransferMode.WRITE),
        ConnectorSettings.DEFAULTS);
    p.engineRef().tell(new PeerProtocol.TransferFailed("tx20", "decode-0", "decode gave up", 0));
    fx.peerInbox.expectNoMessage(QUIET);

    fx.startPeer(decode, fx::peerMetadata);
    PeerProtocol.TransferFailed confirm = fishPeer(PeerProtocol.TransferFailed.class);
    assertEquals("tx20", confirm.transferId());
    assertEquals(1, confirm.senderTpRank());
  }

  @Test
  void aReadFailureWaitsForTheOtherLayersInFlightBeforeInvalidatingAndReleasing() {
    GatedTransport gated = new GatedTransport(fx.transport);
    ConnectorWorker d = readHeldAtTheGate(gated, ConnectorSettings.DEFAULTS, "r6", "tx6");

    // P ends the transfer (it gave up waiting) while our reads are still landing.
    d.engineRef().tell(new PeerProtocol.TransferFailed("tx6", "prefill-0", "prefill gave up", 0));
    fx.peerInbox.expectNoMessage(QUIET);
    assertNothingFinishedFor(d, Duration.ZERO);

    gated.open();
    assertEquals("tx6", fishPeer(PeerProtocol.Release.class).transferId());
    Finished f = fx.awaitFinished(d, x -> x.failed().containsKey("r6"));
    assertTrue(f.failed().get("r6").contains("prefill gave up"), f.toString());
  }

  @Test
  void prefillReadDeadlineAsksDecodeToReleaseAndFreesOnlyOnItsRelease() {
    fx.startPeer(new EngineIdentity(Role.DECODE, "decode-0", 0, 1, 0, 1, TransferMode.READ),
        fx::peerMetadata);
    fx.awaitListed(Role.DECODE, "decode-0");
    ConnectorWorker p =
        fx.worker(Role.PREFILL, TransferMode.READ, "prefill-0", ConnectorSettings.DEFAULTS);
    p.startLoadKv(new ConnectorMetadata(List.of(), List.of(), List.of(
        new ConnectorMetadata.PendingSend("r7", "tx7", System.currentTimeMillis() + 200,
            "decode-0"))));

    PeerProtocol.TransferFailed ask = fishPeer(PeerProtocol.TransferFailed.class);
    assertEquals("tx7", ask.transferId());
    assertTrue(ask.reason().contains("release its blocks"), ask.reason());
    assertNothingFinishedFor(p, QUIET);

    p.engineRef().tell(new PeerProtocol.Release("tx7", "decode-0", 0, 1));
    assertEquals(Set.of("r7"), fx.awaitFinished(p, x -> !x.doneSending().isEmpty()).doneSending());
  }

  @Test
  void prefillAsksAStillListedDecodeAgainWhenItsFirstAskGoesUnanswered() {
    fx.startPeer(new EngineIdentity(Role.DECODE, "decode-0", 0, 1, 0, 1, TransferMode.READ),
        fx::peerMetadata);
    fx.awaitListed(Role.DECODE, "decode-0");
    ConnectorWorker p = fx.worker(Role.PREFILL, TransferMode.READ, "prefill-0",
        ConnectorSettings.DEFAULTS.withReadAbortTimeout(Duration.ofMillis(700)));
    p.startLoadKv(new ConnectorMetadata(List.of(), List.of(), List.of(
        new ConnectorMetadata.PendingSend("r28", "tx28", System.currentTimeMillis() + 200,
            "decode-0"))));
    // The first ask is lost (or reached no worker that read): P asks again, and keeps the
    // blocks meanwhile.
    assertEquals("tx28", fishPeer(PeerProtocol.TransferFailed.class).transferId());
    assertNothingFinishedFor(p, Duration.ZERO);
    assertEquals("tx28", fishPeer(PeerProtocol.TransferFailed.class).transferId());
    assertNothingFinishedFor(p, Duration.ZERO);
    p.engineRef().tell(new PeerProtocol.Release("tx28", "decode-0", 0, 1));
    assertEquals(Set.of("r28"), fx.awaitFinished(p, x -> !x.doneSending().isEmpty()).doneSending());
    fx.peerInbox.expectNoMessage(Duration.ofMillis(1000)); // released: no more asks
  }

  @Test
  void prefillFreesBlocksKeptForADecodeEngineThatWentBeforeItWasEverListedWhenItsWorkerStops() {
    // Seen in the router test on a loaded host: D's engine attached, read three requests and died
    // before the Receptionist's news of it reached P, so no listing change ever said it went.
    // The grace for D to attach again: 2 handshake attempts of 200 ms.
    ConnectorWorker p = fx.worker(Role.PREFILL, TransferMode.READ, "prefill-0",
        ConnectorSettings.DEFAULTS.withHandshake(Duration.ofMillis(200), 2, Duration.ofMillis(10)));
    EngineIdentity d = new EngineIdentity(Role.DECODE, "decode-3", 0, 1, 0, 1, TransferMode.READ);
    ActorRef<EngineActor.Command> dWorker =
        fx.kit.spawn(org.apache.pekko.actor.typed.javadsl.Behaviors.empty(), d.toActorName());
    org.apache.pekko.actor.testkit.typed.javadsl.TestProbe<PeerProtocol.MetadataReply> replies =
        fx.kit.createTestProbe();
    p.engineRef().tell(new PeerProtocol.GetMetadata(replies.ref(), dWorker)); // D reads from P
    replies.receiveMessage(WITHIN);
    p.startLoadKv(new ConnectorMetadata(List.of(), List.of(), List.of(
        new ConnectorMetadata.PendingSend("r9", "tx9", System.currentTimeMillis() + 120_000,
            "decode-3"))));
    assertNothingFinishedFor(p, QUIET);

    fx.kit.stop(dWorker);
    assertEquals(Set.of("r9"), fx.awaitFinished(p, x -> !x.doneSending().isEmpty()).doneSending());
  }

  @Test
  void aReadAbortedWhileItsPrefillWasNotListedYetStillReleasesPrefillOnceListed() {
    // Found with vLLM's rules through real nodes (python/tests/test_vllm_loop.py): P kept the
    // blocks of a request D aborted for its whole read-abort timeout.
    GatedTransport gated = new GatedTransport(fx.transport);
    ConnectorWorker d = fx.worker(Role.DECODE, TransferMode.READ, "decode-0", ConnectorSettings.DEFAULTS,
        gated, fx.localLayers);
    abortLoadFromUnlistedPrefill(d, "r15", "tx15", "prefill-5");
    listedPrefillPeer(new EngineIdentity(Role.PREFILL, "prefill-5", 0, 1, 0, 1, TransferMode.READ));
    assertEquals("tx15", fishPeer(PeerProtocol.Release.class).transferId());
    assertEquals(0, gated.submitted(), "read after its abort");
  }

  @Test
  void aReadEndedTwiceWhilePrefillWasNotListedStillReleasesPrefillOnceListed() {
    // Aborted here, then failed by P (which may know us before we list it): the second ending
    // dropped the release the first had left for P, and P kept its blocks until its timeout.
    ConnectorWorker d = fx.worker(Role.DECODE, TransferMode.READ, "decode-0", ConnectorSettings.DEFAULTS);
    abortLoadFromUnlistedPrefill(d, "r17", "tx17", "prefill-7");
    d.engineRef().tell(new PeerProtocol.TransferFailed("tx17", "prefill-7", "abandoned", 0));
    listedPrefillPeer(new EngineIdentity(Role.PREFILL, "prefill-7", 0, 1, 0, 1, TransferMode.READ));
    assertEquals("tx17", fishPeer(PeerProtocol.Release.class).transferId());
  }

  @Test
  void aWriteReceiveAbortedBeforePrefillWasListedStillEndsItOnPrefillOnceListed() {
    // P had saved the request's KV and waited for our blocks: it waited out its defer timeout.
    ConnectorWorker d = fx.worker(Role.DECODE, TransferMode.WRITE, "decode-0", ConnectorSettings.DEFAULTS);
    d.engineRef().tell(new EngineActor.AnnounceRemoteBlocks(
        new ReqMeta("r16", "tx16", new int[] {5, 6}, null, "prefill-6", 0)));
    TrackedTransfers.assertCount(fx, d, 1);
    d.engineRef().tell(new EngineActor.AbortReceive("r16", "tx16", "request r16 aborted"));
    assertTrue(fx.awaitFinished(d, x -> x.failed().containsKey("r16")).failed().get("r16")
        .contains("aborted"));
    listedPrefillPeer(new EngineIdentity(Role.PREFILL, "prefill-6", 0, 1, 0, 1, TransferMode.WRITE));
    PeerProtocol.TransferFailed told = fishPeer(PeerProtocol.TransferFailed.class);
    assertEquals("tx16", told.transferId());
    assertTrue(told.reason().contains("aborted"), told.reason());
  }

  @Test
  void readWorkHeldForAnUnlistedPrefillIsDroppedWhenItsTransferEnds() {
    GatedTransport gated = new GatedTransport(fx.transport);
    ConnectorWorker d = fx.worker(Role.DECODE, TransferMode.READ, "decode-0",
        ConnectorSettings.DEFAULTS.withTransferTimeout(Duration.ofMillis(300)), gated,
        fx.localLayers);
    d.startLoadKv(new ConnectorMetadata(List.of(),
        List.of(new ReqMeta("r8", "tx8", new int[] {1, 2}, new int[] {3, 4}, "prefill-9", 0)),
        List.of()));
    assertTrue(fx.awaitFinished(d, x -> x.failed().containsKey("r8")).failed().containsKey("r8"));

    // A prefill engine comes (back) under that id after D freed the request's blocks.
    listedPrefillPeer(new EngineIdentity(Role.PREFILL, "prefill-9", 0, 1, 0, 1, TransferMode.READ));
    fx.kit.createTestProbe().expectNoMessage(QUIET);
    assertEquals(0, gated.submitted(), "held reads started into blocks already freed");
  }

  @Test
  void aPreemptionFenceWaitsForTheWritesInFlightAndTheTransferFails() throws Exception {
    // vLLM reuses a preempted request's blocks right after handle_preemptions returns: no copy
    // may read them from then on.
    GatedTransport gated = new GatedTransport(fx.transport);
    ConnectorWorker p = prefillWritingThroughGate(gated, "r18", "tx18");

    java.util.concurrent.CompletableFuture<Void> fence = p.fenceSaves(List.of("r18", "r-other"));
    fx.peerInbox.expectNoMessage(QUIET);
    assertFalse(fence.isDone(), "the fence returned while copies still read the blocks");

    gated.open();
    fence.get(WITHIN.toMillis(), java.util.concurrent.TimeUnit.MILLISECONDS);
    PeerProtocol.TransferFailed told = fishPeer(PeerProtocol.TransferFailed.class);
    assertEquals("tx18", told.transferId());
    assertTrue(told.reason().contains("preempted"), told.reason());
    Finished f = fx.awaitFinished(p, x -> x.failed().containsKey("r18"));
    assertTrue(f.failed().get("r18").contains("preempted"), f.toString());
  }

  @Test
  void aPreemptionFenceFailsASavedWriteStillWaitingForDecodesBlocksWhichThenWritesNothing()
      throws Exception {
    GatedTransport gated = new GatedTransport(fx.transport);
    fx.startPeer(decode, fx::peerMetadata);
    fx.awaitListed(Role.DECODE, "decode-0");
    ConnectorWorker p = fx.worker(Role.PREFILL, TransferMode.WRITE, "prefill-0",
        ConnectorSettings.DEFAULTS, gated, fx.localLayers);
    PeerFixture.saveAllLayers(p, new ReqMeta("r19", "tx19", new int[] {1}, null, "decode-0", 0));
    p.fenceSaves(List.of("r19")).get(WITHIN.toMillis(), java.util.concurrent.TimeUnit.MILLISECONDS);
    // D's blocks come after the fence: the blocks P would copy from now hold another request's KV.
    p.engineRef().tell(new PeerProtocol.RemoteBlocks("tx19", "r19", new int[] {3}, "decode-0", 0, 0));
    assertTrue(fishPeer(PeerProtocol.TransferFailed.class).reason().contains("preempted"));
    fx.peerInbox.expectNoMessage(QUIET);
    assertEquals(0, gated.submitted(), "copied from blocks the engine reuses");
  }

  @Test
  void aPreemptionFenceLeavesATransferWithNothingSavedYetToGoOn() throws Exception {
    // Preempted before its last chunk was computed: nothing of it was saved, nothing reads its
    // blocks; the request saves again once resumed.
    fx.startPeer(decode, fx::peerMetadata);
    fx.awaitListed(Role.DECODE, "decode-0");
    ConnectorWorker p =
        fx.worker(Role.PREFILL, TransferMode.WRITE, "prefill-0", ConnectorSettings.DEFAULTS);
    p.engineRef().tell(new PeerProtocol.RemoteBlocks("tx20", "r20", new int[] {3}, "decode-0", 0, 0));
    p.fenceSaves(List.of("r20")).get(WITHIN.toMillis(), java.util.concurrent.TimeUnit.MILLISECONDS);
    PeerFixture.saveAllLayers(p, new ReqMeta("r20", "tx20", new int[] {2}, null, "decode-0", 0));
    assertEquals("tx20", fishPeer(PeerProtocol.WriteDone.class).transferId());
  }

  @Test
  void aWriteAbortedOnPrefillBeforeItWasSavedIsNotReportedDoneSending() {
    fx.startPeer(decode, fx::peerMetadata);
    fx.awaitListed(Role.DECODE, "decode-0");
    ConnectorWorker p =
        fx.worker(Role.PREFILL, TransferMode.WRITE, "prefill-0", ConnectorSettings.DEFAULTS);
    p.engineRef().tell(new PeerProtocol.RemoteBlocks("tx9", "r9", new int[] {3}, "decode-0", 0, 0));
    // Aborted mid-prefill: the engine frees its blocks at once and saves nothing.
    p.engineRef().tell(
        new EngineActor.AbortTransfer("r9", "tx9", "decode-0", "request r9 aborted on prefill"));
    PeerProtocol.TransferFailed told = fishPeer(PeerProtocol.TransferFailed.class);
    assertTrue(told.reason().contains("aborted on prefill"), told.reason());
    assertNothingFinishedFor(p, QUIET);
  }

  @Test
  void aReadModeLayerWaitReturnsOnlyOnceThatLayerHasLanded() throws Exception {
    GatedTransport gated = new GatedTransport(fx.transport);
    ConnectorWorker d = readHeldAtTheGate(gated, ConnectorSettings.DEFAULTS, "r10", "tx10");

    java.util.concurrent.CompletableFuture<Boolean> layer0 = waitInBackground(d, 0);
    java.util.concurrent.CompletableFuture<Boolean> layer1 = waitInBackground(d, 1);
    fx.kit.createTestProbe().expectNoMessage(QUIET);
    assertTrue(!layer0.isDone() && !layer1.isDone(), "a layer wait returned while reads landed");

    gated.openFor(fx.localLayers.get(0));
    assertTrue(layer0.get(10, java.util.concurrent.TimeUnit.SECONDS));
    fx.kit.createTestProbe().expectNoMessage(Duration.ofMillis(200));
    assertTrue(!layer1.isDone(), "layer 1 is still being read");
    gated.open();
    assertTrue(layer1.get(10, java.util.concurrent.TimeUnit.SECONDS));
    assertEquals(Set.of("r10"), fx.awaitFinished(d, x -> !x.doneReceiving().isEmpty()).doneReceiving());
  }

  @Test
  void aReadIsReportedDoneOnlyOnceItsLastLayerLandedAndReleasesPrefillOnce() {
    GatedTransport gated = new GatedTransport(fx.transport);
    ConnectorWorker d = readHeldAtTheGate(gated, ConnectorSettings.DEFAULTS, "r16", "tx16");

    // The thread completing the last read reports the request at once: not one read before.
    gated.openFor(fx.localLayers.get(0));
    assertNothingFinishedFor(d, QUIET);
    gated.open();
    assertEquals(Set.of("r16"),
        fx.awaitFinished(d, x -> !x.doneReceiving().isEmpty()).doneReceiving());
    assertEquals("tx16", fishPeer(PeerProtocol.Release.class).transferId());
    fx.kit.createTestProbe().awaitAssert(WITHIN, () -> {
      assertEquals(0, d.sink().unsettledEarlyClaims(), "the tracker never settled the read");
      return null;
    });
    TrackedTransfers.assertNone(fx, d);
    assertNothingFinishedFor(d, QUIET); // reported once: not again when the reader settles it
    fx.peerInbox.expectNoMessage(Duration.ofMillis(100)); // one release, not one per ending
  }

  @Test
  void aReadAbortedAfterItWasReportedDoneIsReportedAgainAndReleasesPrefillOnce() {
    GatedTransport gated = new GatedTransport(fx.transport);
    gated.open(); // every read lands as it is made
    ConnectorWorker d = readingDecode(gated, ConnectorSettings.DEFAULTS);
    loadFromPrefill(d, "r17", "tx17", new int[] {1, 2});
    fx.awaitFinished(d, x -> x.doneReceiving().contains("r17"));
    assertEquals("tx17", fishPeer(PeerProtocol.Release.class).transferId());

    // The engine aborts it after the done (its blocks were lent until then): it hears once more.
    // (A regression test of the reader's settled path: the abort comes after its Release.)
    d.engineRef().tell(new EngineActor.AbortReceive("r17", "tx17", "request r17 aborted"));
    Finished f = fx.awaitFinished(d, x -> x.failed().containsKey("r17"));
    assertTrue(f.failed().get("r17").contains("aborted"), f.toString());
    assertTrue(f.doneReceiving().isEmpty(), "reported done twice: " + f);
    fx.peerInbox.expectNoMessage(QUIET);
    assertEquals(0, d.sink().unsettledEarlyClaims());
    TrackedTransfers.assertNone(fx, d);
  }

  @Test
  void aPrefillWorkerStoppingWithWritesUnderWayIsGoneOnlyOnceTheyEnded() throws Exception {
    GatedTransport gated = new GatedTransport(fx.transport);
    ConnectorWorker p = prefillWritingThroughGate(gated, "r27", "tx27");
    // The engine detaches with both layers' copies under way. D learns of the stop from the
    // worker's termination, and may then free its blocks: the copies must have ended by then.
    CompletableFuture<Void> stopped = p.stop();
    fx.kit.createTestProbe().expectNoMessage(QUIET);
    assertFalse(stopped.isDone(), "the worker was gone while its copies could still land");
    gated.open();
    stopped.get(WITHIN.toSeconds(), TimeUnit.SECONDS);
  }

  @Test
  void aReadFromTwoPrefillWorkersWhosePlanIsRefusedFailsAndTheReaderGoesOn() {
    fx.twoPrefillWorkersListed(TransferMode.READ);
    ConnectorWorker d =
        fx.worker(Role.DECODE, TransferMode.READ, "decode-0", ConnectorSettings.DEFAULTS);
    // A first read caches both P workers' metadata, so the next one plans without a handshake.
    loadFromPrefill(d, "r24", "tx24", new int[] {1, 2});
    fx.awaitFinished(d, x -> x.doneReceiving().contains("r24"));
    fishPeer(PeerProtocol.Release.class);
    fishPeer(PeerProtocol.Release.class);

    // Three blocks to fill from P's two: refused at the first P worker's plan, which ends the
    // read before the second worker's turn.
    d.startLoadKv(new ConnectorMetadata(List.of(),
        List.of(new ReqMeta("r25", "tx25", new int[] {5, 6, 7}, new int[] {3, 4}, "prefill-0", 0)),
        List.of()));
    Finished f = fx.awaitFinished(d, x -> x.failed().containsKey("r25"));
    assertTrue(f.failed().get("r25").contains("prefill sent only 2"), f.toString());
    assertEquals("tx25", fishPeer(PeerProtocol.Release.class).transferId());
    assertEquals("tx25", fishPeer(PeerProtocol.Release.class).transferId());

    // The reader is still there: the next read lands and is reported.
    loadFromPrefill(d, "r26", "tx26", new int[] {1, 2});
    fx.awaitFinished(d, x -> x.doneReceiving().contains("r26"));
  }

  @Test
  void readsAbortedJustBeforeTheirLoadsAreEachReportedWithoutWaitingForTheTimeout() {
    ConnectorWorker d = readingDecode(new GatedTransport(fx.transport),
        ConnectorSettings.DEFAULTS.withTransferTimeout(Duration.ofSeconds(60)));
    // The abort reaches the worker's actors just ahead of the step's load (two connections of
    // the engine port): the worker tells the tracker to expect the receive while the reader
    // reports the abort, in either order. Whichever comes first, each is reported now.
    int requests = 20;
    for (int i = 0; i < requests; i++) {
      d.engineRef().tell(new EngineActor.AbortReceive("ra" + i, "txa" + i, "request ra" + i
          + " aborted"));
      loadFromPrefill(d, "ra" + i, "txa" + i, new int[] {1, 2});
    }
    Finished f = fx.awaitFinished(d, x -> x.failed().size() == requests);
    assertTrue(f.doneReceiving().isEmpty(), f.toString());
    TrackedTransfers.assertNone(fx, d);
  }

  private static java.util.concurrent.CompletableFuture<Boolean> waitInBackground(
      ConnectorWorker d, int layer) {
    return java.util.concurrent.CompletableFuture.supplyAsync(() -> {
      try {
        return d.waitForLayerLoad(layer);
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
        return false;
      }
    });
  }

  @Test
  void aReceiveFromTwoPrefillWorkersIsReportedOnlyOnceBothHaveWritten() {
    fx.twoPrefillWorkersListed();
    ConnectorWorker d =
        fx.worker(Role.DECODE, TransferMode.WRITE, "decode-0", ConnectorSettings.DEFAULTS);
    d.engineRef().tell(new EngineActor.AnnounceRemoteBlocks(
        new ReqMeta("r11", "tx11", new int[] {1, 2}, null, "prefill-0", 0)));
    fishPeer(PeerProtocol.RemoteBlocks.class);
    fishPeer(PeerProtocol.RemoteBlocks.class);
    d.engineRef().tell(new PeerProtocol.WriteDone("tx11", "prefill-0", 0));
    assertNothingFinishedFor(d, QUIET);
    d.engineRef().tell(new PeerProtocol.WriteDone("tx11", "prefill-0", 1));
    assertEquals(Set.of("r11"), fx.awaitFinished(d, x -> !x.doneReceiving().isEmpty()).doneReceiving());
  }

  @Test
  void aTimeoutAfterOneOfTwoPrefillWorkersWroteAsksOnlyTheOtherAndWaitsForIt() {
    fx.twoPrefillWorkersListed();
    ConnectorWorker d = fx.worker(Role.DECODE, TransferMode.WRITE, "decode-0",
        ConnectorSettings.DEFAULTS.withTransferTimeout(Duration.ofMillis(400)));
    d.engineRef().tell(new EngineActor.AnnounceRemoteBlocks(
        new ReqMeta("r12", "tx12", new int[] {1, 2}, null, "prefill-0", 0)));
    fishPeer(PeerProtocol.RemoteBlocks.class);
    fishPeer(PeerProtocol.RemoteBlocks.class);
    d.engineRef().tell(new PeerProtocol.WriteDone("tx12", "prefill-0", 0));

    assertEquals("tx12", fishPeer(PeerProtocol.TransferFailed.class).transferId());
    fx.peerInbox.expectNoMessage(QUIET); // worker 0 is done: only worker 1 is asked
    assertNothingFinishedFor(d, Duration.ZERO);
    d.engineRef().tell(new PeerProtocol.TransferFailed("tx12", "prefill-0", "abandoned", 1));
    Finished f = fx.awaitFinished(d, x -> x.failed().containsKey("r12"));
    assertEquals(Set.of(1, 2), f.blockIdsWithLoadErrors());
  }

  @Test
  void aRequestAbortedAfterItsTransferEndedLeavesNothingInTheWorkersTracking() {
    listedPrefillPeer(prefill);
    ConnectorWorker d =
        fx.worker(Role.DECODE, TransferMode.WRITE, "decode-0", ConnectorSettings.DEFAULTS);
    ConnectorScheduler sched = new ConnectorScheduler(Role.DECODE, TransferMode.WRITE, "decode-0",
        0, PeerFixture.BLOCK, List.of(d.engineRef()), ConnectorSettings.DEFAULTS,
        Clock.systemUTC());
    ConnectorRequest req =
        new ConnectorRequest("r13", 8, KvTransferParams.forDecode("tx13", "prefill-0", 0));
    sched.updateStateAfterAlloc(req, new int[] {3, 4}, 8);
    fishPeer(PeerProtocol.RemoteBlocks.class);
    d.engineRef().tell(new PeerProtocol.WriteDone("tx13", "prefill-0", 0));
    fx.awaitFinished(d, x -> x.doneReceiving().contains("r13"));

    // Aborted while decoding: the free was delayed, so the request is reported once more.
    req.setStatus(ConnectorRequest.Status.FINISHED_ABORTED);
    assertTrue(sched.requestFinished(req, new int[] {3, 4}).delayFreeBlocks());
    assertTrue(fx.awaitFinished(d, x -> x.failed().containsKey("r13")).failed().get("r13")
        .contains("aborted on decode engine"));
    TrackedTransfers.assertNone(fx, d);
  }

  @Test
  void readWorkHeldForAnUnlistedPrefillIsBoundedDroppingTheOldest() {
    GatedTransport gated = new GatedTransport(fx.transport);
    gated.open(); // copies land at once
    ConnectorSettings capacityTwo = new ConnectorSettings(Duration.ofSeconds(3), 4,
        Duration.ofMillis(200), Duration.ofSeconds(60), Duration.ofMinutes(10),
        Duration.ofSeconds(120), 2, false, Duration.ofSeconds(1));
    ConnectorWorker d = fx.worker(Role.DECODE, TransferMode.READ, "decode-0", capacityTwo, gated,
        fx.localLayers);
    d.startLoadKv(new ConnectorMetadata(List.of(), List.of(
        new ReqMeta("ra", "tx-a", new int[] {1}, new int[] {1}, "prefill-9", 0),
        new ReqMeta("rb", "tx-b", new int[] {2}, new int[] {2}, "prefill-9", 0),
        new ReqMeta("rc", "tx-c", new int[] {3}, new int[] {3}, "prefill-9", 0)), List.of()));
    TrackedTransfers.assertCount(fx, d, 3); // the worker has taken the step's loads

    listedPrefillPeer(new EngineIdentity(Role.PREFILL, "prefill-9", 0, 1, 0, 1, TransferMode.READ));
    Finished f = fx.awaitFinished(d, x -> x.doneReceiving().containsAll(Set.of("rb", "rc")));
    fx.kit.createTestProbe().expectNoMessage(QUIET);
    assertTrue(!d.getFinished().doneReceiving().contains("ra") && !f.doneReceiving().contains("ra"),
        "the oldest held load was kept beyond the bound");
    assertEquals(2 * PeerFixture.LAYERS, gated.submitted());
  }

  @Test
  void aTransferIdUsedAgainAfterItsReadEndedReadsNothingIntoTheNewRequestsBlocks() {
    GatedTransport gated = new GatedTransport(fx.transport);
    gated.open(); // copies land at once
    ConnectorWorker d = readingDecode(gated, ConnectorSettings.DEFAULTS);
    loadFromPrefill(d, "r20", "tx20", new int[] {1, 2});
    assertEquals("tx20", fishPeer(PeerProtocol.Release.class).transferId());
    fx.awaitFinished(d, x -> x.doneReceiving().contains("r20"));
    int reads = gated.submitted();

    // The engine hands the same transfer id over again, for other blocks: refused, and nothing
    // is read into them (P freed its blocks on the release; the engine frees these on the error).
    loadFromPrefill(d, "r21", "tx20", new int[] {5, 6});
    Finished f = fx.awaitFinished(d, x -> x.failed().containsKey("r21"));
    assertTrue(f.failed().get("r21").contains("duplicate transfer id tx20"), f.toString());
    fx.peerInbox.expectNoMessage(QUIET);
    assertEquals(reads, gated.submitted(), "a read into blocks the engine was told failed");
  }

  @Test
  void aTransferIdUsedAgainAfterItsReceiveEndedTellsNoPrefillWorkerTheNewRequestsBlocks() {
    listedPrefillPeer(prefill);
    ConnectorWorker d = fx.worker(Role.DECODE, TransferMode.WRITE, "decode-0",
        ConnectorSettings.DEFAULTS);
    d.engineRef().tell(new EngineActor.AnnounceRemoteBlocks(
        new ReqMeta("r22", "tx22", new int[] {1, 2}, null, "prefill-0", 0)));
    assertEquals("tx22", fishPeer(PeerProtocol.RemoteBlocks.class).transferId());
    d.engineRef().tell(new PeerProtocol.WriteDone("tx22", "prefill-0", 0));
    fx.awaitFinished(d, x -> x.doneReceiving().contains("r22"));

    d.engineRef().tell(new EngineActor.AnnounceRemoteBlocks(
        new ReqMeta("r23", "tx22", new int[] {5, 6}, null, "prefill-0", 0)));
    Finished f = fx.awaitFinished(d, x -> x.failed().containsKey("r23"));
    assertTrue(f.failed().get("r23").contains("duplicate transfer id tx22"), f.toString());
    // Told to P, blocks 5 and 6 could be written after the engine freed them on the error.
    fx.peerInbox.expectNoMessage(QUIET);
  }
}
