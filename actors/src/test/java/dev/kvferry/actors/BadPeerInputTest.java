package dev.kvferry.actors;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvferry.actors.connector.ConnectorWorker;
import dev.kvferry.actors.connector.Finished;
import dev.kvferry.actors.connector.ReqMeta;
import dev.kvferry.actors.connector.Role;
import dev.kvferry.actors.connector.TransferMode;
import dev.kvferry.actors.engine.ConnectorSettings;
import dev.kvferry.actors.engine.EngineIdentity;
import dev.kvferry.rdma.MemoryRegion;
import java.nio.ByteBuffer;
import java.time.Duration;
import java.util.List;
import java.util.Set;
import java.util.stream.IntStream;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;

/**
 * A real prefill (or decode) worker fed what a faulty or hostile peer might send: block ids out of
 * range, negative, repeated or too many; unknown engine ids; a transfer id used twice. Each
 * request fails with an error that names it and what is wrong, not a byte lands outside (or, for a
 * refused request, inside) the peer's registered regions, and the worker serves the next good
 * request.
 */
class BadPeerInputTest {

  private static final Duration WITHIN = Duration.ofSeconds(10);
  private final PeerFixture fx = new PeerFixture();
  private final EngineIdentity decode =
      new EngineIdentity(Role.DECODE, "decode-0", 0, 1, 0, 1, TransferMode.WRITE);

  @AfterEach
  void stop() {
    fx.close();
  }

  private ConnectorWorker prefillWithListedDecode(ConnectorSettings s) {
    ConnectorWorker p = fx.worker(Role.PREFILL, TransferMode.WRITE, "prefill-0", s);
    fx.startPeer(decode, fx::peerMetadata);
    fx.awaitListed(Role.DECODE, "decode-0");
    return p;
  }

  /** P computes {@code request} on its blocks 1, 2, 3 and D (the test) names {@code remote}. */
  private PeerProtocol.TransferFailed refused(ConnectorWorker p, String request, int[] remote) {
    String tx = "tx-" + request;
    PeerFixture.saveAllLayers(p, new ReqMeta(request, tx, new int[] {1, 2, 3}, null, "decode-0", 0));
    p.engineRef().tell(new PeerProtocol.RemoteBlocks(tx, request, remote, "decode-0", 0, 0));
    PeerProtocol.TransferFailed f = fx.peerInbox.expectMessageClass(PeerProtocol.TransferFailed.class, WITHIN);
    assertEquals(tx, f.transferId());
    assertEquals("prefill-0", f.engineId());
    Finished done = fx.awaitFinished(p, x -> x.failed().containsKey(request));
    assertTrue(done.doneSending().contains(request), "P frees the refused request's blocks: " + done);
    assertEquals(f.reason(), done.failed().get(request));
    assertTrue(fx.peerUntouched(), "no byte of a refused request reached D's regions");
    return f;
  }

  /** A good request after the bad ones: written, reported, bytes in place. */
  private void servesTheNextGoodRequest(ConnectorWorker p, String request) {
    String tx = "tx-" + request;
    PeerFixture.saveAllLayers(p, new ReqMeta(request, tx, new int[] {4, 5}, null, "decode-0", 0));
    p.engineRef().tell(new PeerProtocol.RemoteBlocks(tx, request, new int[] {10, 11}, "decode-0", 0, 0));
    PeerProtocol.WriteDone done = fx.peerInbox.expectMessageClass(PeerProtocol.WriteDone.class, WITHIN);
    assertEquals(tx, done.transferId());
    assertTrue(fx.awaitFinished(p, x -> x.doneSending().contains(request)).failed().isEmpty());
    long block = PeerFixture.GEOMETRY.blockBytes();
    long stride = PeerFixture.GEOMETRY.kToVStrideBytes();
    for (int l = 0; l < PeerFixture.LAYERS; l++) {
      MemoryRegion d = fx.peerLayers.get(l);
      ByteBuffer b = d.buffer(0, (int) d.lengthBytes());
      for (int i = 0; i < b.capacity(); i++) {
        long half = i / stride * stride; // K or V
        long inBlock = (i % stride) / block;
        // D's blocks 10 and 11 hold P's blocks 4 and 5, the same position in the same half.
        long source = inBlock == 10 ? 4 : inBlock == 11 ? 5 : -1;
        byte expected = source < 0 ? 0
            : PeerFixture.patternByte(l, half + source * block + i % block);
        if (b.get(i) != expected) {
          throw new AssertionError("layer " + l + " byte " + i + " of D is " + b.get(i)
              + ", expected " + expected);
        }
      }
    }
  }

  @Test
  void remoteBlockIdsOutOfRangeNegativeRepeatedOrTooManyAreRefusedAndPrefillKeepsServing() {
    ConnectorWorker p = prefillWithListedDecode(ConnectorSettings.DEFAULTS);
    record Case(int[] remote, String reason) {}
    int numBlocks = PeerFixture.GEOMETRY.numBlocks();
    List<Case> cases = List.of(
        new Case(new int[] {0, numBlocks, 2},
            "remote block id " + numBlocks + " at position 1 is out of range"),
        new Case(new int[] {0, 1, Integer.MAX_VALUE}, "remote block id 2147483647 at position 2 is out of range"),
        new Case(new int[] {-1, 1, 2}, "remote block id -1 at position 0 is negative"),
        new Case(new int[] {7, 8, 7}, "remote block id 7 at position 2 repeats position 0"),
        new Case(new int[] {0, 1, 2, 3}, "decode sent 4 blocks but prefill has only 3"),
        // Oversized: far more ids than any request has; refused on length alone.
        new Case(IntStream.range(0, 200_000).toArray(), "decode sent 200000 blocks but prefill has only 3"));
    int i = 0;
    for (Case c : cases) {
      String request = "bad-" + i++;
      String reason = refused(p, request, c.remote()).reason();
      assertTrue(reason.contains(c.reason()), reason);
      assertTrue(reason.contains("request " + request), "the error names the request: " + reason);
    }
    servesTheNextGoodRequest(p, "good");
  }

  @Test
  void duplicateRemoteBlocksForOneTransferAreIgnoredAndTheFirstListIsWritten() {
    ConnectorWorker p = prefillWithListedDecode(ConnectorSettings.DEFAULTS);
    p.engineRef().tell(new PeerProtocol.RemoteBlocks("tx-good", "good", new int[] {10, 11}, "decode-0", 0, 0));
    // A second list for the same transfer (replayed or forged) must not redirect the writes.
    p.engineRef().tell(new PeerProtocol.RemoteBlocks("tx-good", "good", new int[] {0, 1}, "decode-0", 0, 0));
    servesTheNextGoodRequest(p, "good");
  }

  @Test
  void aTransferIdUsedTwiceOnDecodeIsRefusedWithoutDisturbingTheFirst() {
    ConnectorWorker d = fx.worker(Role.DECODE, TransferMode.WRITE, "decode-0", ConnectorSettings.DEFAULTS);
    d.engineRef().tell(new EngineActor.AnnounceRemoteBlocks(
        new ReqMeta("first", "tx-same", new int[] {1, 2}, null, "prefill-0", 0)));
    d.engineRef().tell(new EngineActor.AnnounceRemoteBlocks(
        new ReqMeta("second", "tx-same", new int[] {3, 4}, null, "prefill-0", 0)));
    Finished f = fx.awaitFinished(d, x -> x.failed().containsKey("second"));
    assertTrue(f.failed().get("second").contains("duplicate transfer id tx-same for request second"),
        f.failed().toString());
    d.engineRef().tell(new PeerProtocol.WriteDone("tx-same", "prefill-0", 0));
    assertEquals(Set.of("first"), fx.awaitFinished(d, x -> !x.doneReceiving().isEmpty()).doneReceiving());
  }

  @Test
  void unknownEngineIdsFailTheirRequestsAndTheWorkerKeepsServing() {
    ConnectorSettings quick =
        ConnectorSettings.DEFAULTS
            .withHandshake(Duration.ofMillis(200), 2, Duration.ofMillis(50))
            .withTransferTimeout(Duration.ofSeconds(1));
    ConnectorWorker p = prefillWithListedDecode(quick);
    // P: a request for a decode engine nobody runs.
    PeerFixture.saveAllLayers(p, new ReqMeta("lost", "tx-lost", new int[] {1}, null, "no-such-decode", 0));
    Finished f = fx.awaitFinished(p, x -> x.failed().containsKey("lost"));
    assertTrue(f.failed().get("lost").contains("engine no-such-decode is not a member of the cluster"),
        f.failed().toString());
    assertTrue(f.doneSending().contains("lost"), "P frees it");
    // Blocks announced by an engine that is not the request's decode are written nowhere.
    p.engineRef().tell(new PeerProtocol.RemoteBlocks("tx-stranger", "stranger", new int[] {1}, "no-such-decode", 0, 0));
    servesTheNextGoodRequest(p, "good");

    // D: a request whose prefill engine does not exist ends at the transfer timeout, named.
    ConnectorWorker d = fx.worker(Role.DECODE, TransferMode.WRITE, "decode-9", quick);
    d.engineRef().tell(new EngineActor.AnnounceRemoteBlocks(
        new ReqMeta("orphan", "tx-orphan", new int[] {1}, null, "no-such-prefill", 0)));
    Finished df = fx.awaitFinished(d, x -> x.failed().containsKey("orphan"));
    assertTrue(df.failed().get("orphan").contains("from no-such-prefill did not finish within 1000 ms"),
        df.failed().toString());
    // A write-done or failure from an engine for a transfer it never had is ignored.
    d.engineRef().tell(new PeerProtocol.WriteDone("tx-never", "no-such-prefill", 0));
    d.engineRef().tell(new PeerProtocol.Release("tx-never", "no-such-prefill", 0, 1));
    d.engineRef().tell(new EngineActor.AnnounceRemoteBlocks(
        new ReqMeta("after", "tx-after", new int[] {2}, null, "no-such-prefill", 0)));
    d.engineRef().tell(new PeerProtocol.WriteDone("tx-after", "no-such-prefill", 0));
    assertEquals(Set.of("after"), fx.awaitFinished(d, x -> !x.doneReceiving().isEmpty()).doneReceiving());
  }

  private static ConnectorSettings holding(Duration transferTimeout, int terminalIdCapacity) {
    ConnectorSettings d = ConnectorSettings.DEFAULTS;
    return new ConnectorSettings(d.handshakeTimeout(), d.handshakeAttempts(),
        d.handshakeBackoff(), d.deferTimeout(), transferTimeout, d.readAbortTimeout(),
        terminalIdCapacity, d.readsAtAdmission(), d.reattachGrace());
  }

  /** P tells {@code decode} (listed or not) that transfer {@code tx} failed. */
  /**
   * An abort's notice to D goes through P's writer and back to its worker: a transfer listing,
   * which takes the same way, returns only once every notice asked for before it is with the
   * worker (held, or sent), so the peer listed next cannot overtake them.
   */
  private void awaitNoticesQueued(ConnectorWorker p) {
    org.apache.pekko.actor.testkit.typed.javadsl.TestProbe<TransferSnapshot> listing =
        fx.kit.createTestProbe();
    p.engineRef().tell(new EngineActor.GetTransfers(listing.ref()));
    listing.receiveMessage(WITHIN);
  }

  private static void abort(ConnectorWorker p, String tx, String decode) {
    p.engineRef().tell(new EngineActor.AbortTransfer("r-" + tx, tx, decode, "test abort " + tx));
  }

  /** The transfer ids of the next {@code n} failure notices the peer receives. */
  private List<String> nextFailureNotices(int n) {
    List<String> ids = new java.util.ArrayList<>();
    while (ids.size() < n) {
      Object m = fx.peerInbox.receiveMessage(WITHIN);
      if (m instanceof PeerProtocol.TransferFailed f) {
        ids.add(f.transferId());
      }
    }
    return ids;
  }

  private static final EngineIdentity LATE_DECODE =
      new EngineIdentity(Role.DECODE, "late-decode", 0, 1, 0, 1, TransferMode.WRITE);

  @Test
  void messagesHeldForAnEngineNotListedYetReachItWhenItIsListedWithinTheTransferTimeout() {
    ConnectorWorker p = fx.worker(Role.PREFILL, TransferMode.WRITE, "prefill-0",
        holding(Duration.ofMinutes(10), 64));
    abort(p, "tx-held", "late-decode");
    fx.startPeer(LATE_DECODE, fx::peerMetadata);
    assertEquals(List.of("tx-held"), nextFailureNotices(1));
  }

  @Test
  void messagesHeldForAnEngineNotListedArePassedOnlyWithinTheTransferTimeout() {
    // A transfer timeout shorter than any hold: the notice for the engine not listed is dropped,
    // so the first notice it receives once listed is one sent after that.
    ConnectorWorker p = fx.worker(Role.PREFILL, TransferMode.WRITE, "prefill-0",
        holding(Duration.ofNanos(1), 64));
    abort(p, "tx-stale", "late-decode");
    awaitNoticesQueued(p);
    fx.startPeer(LATE_DECODE, fx::peerMetadata);
    fx.awaitListed(Role.DECODE, "late-decode");
    String[] first = new String[1];
    fx.peerInbox.awaitAssert(WITHIN, Duration.ofMillis(50), () -> {
      String tx = "tx-fresh-" + System.nanoTime();
      abort(p, tx, "late-decode");
      Object m = fx.peerInbox.receiveMessage(Duration.ofMillis(500));
      assertTrue(m instanceof PeerProtocol.TransferFailed, String.valueOf(m));
      first[0] = ((PeerProtocol.TransferFailed) m).transferId();
      return null;
    });
    assertTrue(first[0].startsWith("tx-fresh-"), "the stale notice was passed on: " + first[0]);
  }

  @Test
  void messagesHeldForEnginesNotListedAreCappedAtTheTerminalIdCapacityKeepingTheNewest() {
    ConnectorWorker p = fx.worker(Role.PREFILL, TransferMode.WRITE, "prefill-0",
        holding(Duration.ofMinutes(10), 4));
    for (int i = 0; i < 10; i++) {
      abort(p, "tx-" + i, "late-decode");
    }
    awaitNoticesQueued(p);
    fx.startPeer(LATE_DECODE, fx::peerMetadata);
    assertEquals(List.of("tx-6", "tx-7", "tx-8", "tx-9"), nextFailureNotices(4));
    abort(p, "tx-after", "late-decode");
    assertEquals(List.of("tx-after"), nextFailureNotices(1), "only the newest four were held");
  }
}
