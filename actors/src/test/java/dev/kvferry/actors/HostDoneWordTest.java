package dev.kvferry.actors;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvferry.actors.connector.ConnectorWorker;
import dev.kvferry.actors.connector.Finished;
import dev.kvferry.actors.connector.ReqMeta;
import dev.kvferry.actors.connector.Role;
import dev.kvferry.actors.connector.TransferMode;
import dev.kvferry.actors.engine.AgentMetadata;
import dev.kvferry.actors.engine.ConnectorSettings;
import dev.kvferry.actors.engine.EngineIdentity;
import dev.kvferry.rdma.CmaTransport;
import dev.kvferry.rdma.MemoryRegion;
import dev.kvferry.rdma.PeerDoneWords;
import dev.kvferry.rdma.RegionDescriptor;
import dev.kvferry.rdma.TcpTransport;
import dev.kvferry.rdma.TransferBatch;
import dev.kvferry.rdma.TransferStatus;
import dev.kvferry.rdma.Transport;
import dev.kvferry.rdma.TransportOptions;
import dev.kvferry.rdma.cuda.SharedDoneWords;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Set;
import java.util.concurrent.TimeUnit;
import org.apache.pekko.actor.testkit.typed.javadsl.FishingOutcomes;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;

/**
 * The done word over the host transports, through the actors, with real bytes moved by cma
 * (within this process) or tcp (loopback sockets): D's receive completes from the word P stores
 * behind its writes, with no WriteDone; WriteDone still completes it when no word is stored; and
 * P's writer stores D's word behind its last layer's writes.
 */
class HostDoneWordTest {
  private static final Duration WITHIN = Duration.ofSeconds(10);

  private final PeerFixture fx = new PeerFixture();
  private final List<AutoCloseable> closing = new ArrayList<>();
  private final EngineIdentity prefill =
      new EngineIdentity(Role.PREFILL, "prefill-0", 0, 1, 0, 1, TransferMode.WRITE);
  private final EngineIdentity decode =
      new EngineIdentity(Role.DECODE, "decode-0", 0, 1, 0, 1, TransferMode.WRITE);

  @AfterEach
  void stop() throws Exception {
    fx.close();
    for (AutoCloseable c : closing) {
      c.close();
    }
  }

  private <T extends AutoCloseable> T closeLater(T c) {
    closing.add(c);
    return c;
  }

  private <T> T fishPeer(Class<T> type) {
    return type.cast(fx.peerInbox.fishForMessage(WITHIN,
        m -> type.isInstance(m) ? FishingOutcomes.complete() : FishingOutcomes.continueAndIgnore())
        .get(0));
  }

  /** D's transport over D's layers (fx.peerLayers) and P's over P's (fx.localLayers). */
  private record Pair(Transport d, Transport p) {}

  private Pair transports(String kind) throws IOException {
    return switch (kind) {
      case "cma" -> new Pair(closeLater(new CmaTransport()), closeLater(new CmaTransport()));
      case "tcp" -> new Pair(
          closeLater(new TcpTransport(fx.peerRegistry, TransportOptions.defaults())),
          // P listens too: its worker describes its own layers at registration.
          closeLater(new TcpTransport(fx.localRegistry, TransportOptions.defaults())));
      default -> throw new IllegalArgumentException(kind);
    };
  }

  /** A real decode worker announcing a receive from the hand-played prefill peer. */
  private ConnectorWorker decodeAnnouncing(Transport d, String requestId) {
    fx.startPeer(prefill, fx::peerMetadata);
    fx.awaitListed(Role.PREFILL, "prefill-0");
    ConnectorWorker w = fx.worker(Role.DECODE, TransferMode.WRITE, "decode-0",
        ConnectorSettings.DEFAULTS, d, fx.peerLayers);
    w.engineRef().tell(new EngineActor.AnnounceRemoteBlocks(
        new ReqMeta(requestId, "tx-" + requestId, new int[] {1, 2}, null, "prefill-0", 0)));
    return w;
  }

  /** The test as P: every layer of P's cache written into D's with real bytes. */
  private List<TransferStatus> writeEveryLayer(Transport d, Transport p) {
    List<TransferStatus> writes = new ArrayList<>();
    for (int l = 0; l < PeerFixture.LAYERS; l++) {
      MemoryRegion from = fx.localLayers.get(l);
      writes.add(p.write(from, d.describe(fx.peerLayers.get(l)), new TransferBatch(
          new long[] {0}, new long[] {0}, new long[] {from.lengthBytes()})));
    }
    return writes;
  }

  private void assertDecodeHoldsPrefillsBytes() {
    for (int l = 0; l < PeerFixture.LAYERS; l++) {
      int n = (int) fx.localLayers.get(l).lengthBytes();
      assertEquals(fx.localLayers.get(l).buffer(0, n), fx.peerLayers.get(l).buffer(0, n),
          "layer " + l + " at D");
    }
  }

  private void decodeCompletesFromTheWordAlone(String kind) throws Exception {
    Pair t = transports(kind);
    ConnectorWorker d = decodeAnnouncing(t.d(), "r1");
    PeerProtocol.RemoteBlocks blocks = fishPeer(PeerProtocol.RemoteBlocks.class);
    PeerProtocol.DoneWord word = blocks.doneWord();
    assertNotNull(word, kind + " stores done words, so D offers one");

    PeerDoneWords theirs = closeLater(t.p().openPeerDoneWords(word.file(), word.slots()));
    List<TransferStatus> writes = writeEveryLayer(t.d(), t.p());
    TransferStatus stored = theirs.storeAfter(writes, fx.localLayers.get(0),
        t.d().describe(fx.peerLayers.get(0)), word.slot(), word.value());
    assertTrue(stored.completion().get(10, TimeUnit.SECONDS).succeeded(), stored::toString);

    // No WriteDone is ever told: the word alone completes the receive.
    Finished f = fx.awaitFinished(d, x -> x.doneReceiving().contains("r1"));
    assertEquals(Set.of("r1"), f.doneReceiving(), f.toString());
    assertTrue(f.failed().isEmpty(), f.toString());
    assertDecodeHoldsPrefillsBytes();
  }

  @Test
  void decodeCompletesACmaReceiveFromTheDoneWordWithoutWriteDone() throws Exception {
    decodeCompletesFromTheWordAlone("cma");
  }

  @Test
  void decodeCompletesATcpReceiveFromTheDoneWordWithoutWriteDone() throws Exception {
    decodeCompletesFromTheWordAlone("tcp");
  }

  /**
   * P at TP 2 writes a D worker at TP 1: both P workers write into its blocks, each told a word of
   * its own; the receive is done once both words are stored, not on the first with its worker's
   * WriteDone, and without the second worker's WriteDone.
   */
  private void decodeCompletesFromTwoWritersWordsOnlyOnceBothLanded(String kind) throws Exception {
    Pair t = transports(kind);
    fx.twoPrefillWorkersListed();
    ConnectorWorker d = fx.worker(Role.DECODE, TransferMode.WRITE, "decode-0",
        ConnectorSettings.DEFAULTS, t.d(), fx.peerLayers);
    d.engineRef().tell(new EngineActor.AnnounceRemoteBlocks(
        new ReqMeta("r4", "tx-r4", new int[] {1, 2}, null, "prefill-0", 0)));
    PeerProtocol.DoneWord a = fishPeer(PeerProtocol.RemoteBlocks.class).doneWord();
    PeerProtocol.DoneWord b = fishPeer(PeerProtocol.RemoteBlocks.class).doneWord();
    assertNotNull(a, kind + ": each P worker is offered a word");
    assertNotNull(b, kind + ": each P worker is offered a word");
    assertTrue(a.slot() != b.slot(), "two writers share slot " + a.slot());
    // Words are handed out in the order of the workers' ranks (0, 1): the lower value is rank 0's.
    PeerProtocol.DoneWord first = a.value() < b.value() ? a : b;
    PeerProtocol.DoneWord second = first == a ? b : a;

    PeerDoneWords theirs = closeLater(t.p().openPeerDoneWords(first.file(), first.slots()));
    List<TransferStatus> writes = writeEveryLayer(t.d(), t.p());
    RegionDescriptor layer0 = t.d().describe(fx.peerLayers.get(0));
    TransferStatus one = theirs.storeAfter(writes, fx.localLayers.get(0), layer0, first.slot(),
        first.value());
    assertTrue(one.completion().get(10, TimeUnit.SECONDS).succeeded(), one::toString);
    // As P does: rank 0 sends its WriteDone after its word. Rank 1 still writes.
    d.engineRef().tell(new PeerProtocol.WriteDone("tx-r4", "prefill-0", 0));
    fx.kit.createTestProbe().expectNoMessage(Duration.ofMillis(300));
    assertTrue(d.getFinished().isEmpty(), "done on one of two writers' words");

    TransferStatus two = theirs.storeAfter(List.of(), fx.localLayers.get(0), layer0,
        second.slot(), second.value());
    assertTrue(two.completion().get(10, TimeUnit.SECONDS).succeeded(), two::toString);
    // No WriteDone from rank 1: its word completes the receive.
    Finished f = fx.awaitFinished(d, x -> x.doneReceiving().contains("r4"));
    assertEquals(Set.of("r4"), f.doneReceiving(), f.toString());
    assertTrue(f.failed().isEmpty(), f.toString());
    assertDecodeHoldsPrefillsBytes();
  }

  @Test
  void decodeCompletesACmaReceiveFromTwoPrefillWorkersWordsOnlyOnceBothLanded() throws Exception {
    decodeCompletesFromTwoWritersWordsOnlyOnceBothLanded("cma");
  }

  @Test
  void decodeCompletesATcpReceiveFromTwoPrefillWorkersWordsOnlyOnceBothLanded() throws Exception {
    decodeCompletesFromTwoWritersWordsOnlyOnceBothLanded("tcp");
  }

  /** D announces a receive with a done word over cma; the test as P writes every layer, no word. */
  private ConnectorWorker writtenOverCmaWithoutItsWord(String requestId) throws Exception {
    Pair t = transports("cma");
    ConnectorWorker d = decodeAnnouncing(t.d(), requestId);
    assertNotNull(fishPeer(PeerProtocol.RemoteBlocks.class).doneWord());
    for (TransferStatus w : writeEveryLayer(t.d(), t.p())) {
      assertTrue(w.completion().get(10, TimeUnit.SECONDS).succeeded(), w::toString);
    }
    return d;
  }

  @Test
  void anAbortAfterTheWordReportedTheReceiveDoneStillGetsItsOwnReport() throws Exception {
    // The engine holds an aborted request's blocks until the workers report it again (its free
    // is delayed). Here the engine aborts after the watcher reported the receive done and before
    // the receiver heard of the word: played by reporting as the watcher does, with no
    // DoneWordSeen after it. Without the receiver settling first, the abort waited for P.
    ConnectorWorker d = writtenOverCmaWithoutItsWord("r3");
    assertTrue(d.sink().landedEarly("tx-r3", true, 0), "the receiver handed out no claim with its word");
    assertEquals(Set.of("r3"), d.getFinished().doneReceiving());
    d.engineRef().tell(new EngineActor.AbortReceive("r3", "tx-r3", "aborted after its done"));
    Finished f = fx.awaitFinished(d, x -> x.failed().containsKey("r3"));
    assertTrue(f.doneReceiving().isEmpty(), "reported done twice: " + f);
    assertTrue(f.failed().get("r3").contains("aborted after its done"), f.toString());
    assertEquals(0, d.sink().unsettledEarlyClaims(), "a claim left behind");
  }

  @Test
  void writeDoneStillCompletesAReceiveWhoseWordIsNeverStored() throws Exception {
    ConnectorWorker d = writtenOverCmaWithoutItsWord("r2");
    // Written, but P could not map the words (or the slot was reused): no word, only WriteDone.
    fx.kit.createTestProbe().expectNoMessage(Duration.ofMillis(300));
    assertTrue(d.getFinished().isEmpty(), "done before any word or WriteDone");
    d.engineRef().tell(new PeerProtocol.WriteDone("tx-r2", "prefill-0", 0));
    assertEquals(Set.of("r2"),
        fx.awaitFinished(d, x -> !x.doneReceiving().isEmpty()).doneReceiving());
    assertDecodeHoldsPrefillsBytes();
  }

  private void prefillStoresTheWordBehindItsWrites(String kind) throws Exception {
    Pair t = transports(kind);
    SharedDoneWords words = closeLater(SharedDoneWords.create(SharedDoneWords.PEER_DIR,
        "kvferry-done-actors-test-" + ProcessHandle.current().pid() + "-"
            + Long.toHexString(System.nanoTime()), 64));
    t.d().acceptDoneWords(words); // what D's ReceiverActor does (tcp: its listener stores it)
    fx.startPeer(decode, peer -> {
      List<RegionDescriptor> layers = new ArrayList<>();
      for (MemoryRegion r : fx.peerLayers) {
        layers.add(t.d().describe(r));
      }
      return new AgentMetadata(peer.engineId(), peer.dpRank(), peer.tpRank(), peer.tpSize(),
          t.d().name(), PeerFixture.GEOMETRY, layers).pack();
    });
    fx.awaitListed(Role.DECODE, "decode-0");
    ConnectorWorker p = fx.worker(Role.PREFILL, TransferMode.WRITE, "prefill-0",
        ConnectorSettings.DEFAULTS, t.p(), fx.localLayers);

    ReqMeta r = new ReqMeta("r3", "tx3", new int[] {1, 2}, null, "decode-0", 0);
    p.engineRef().tell(new PeerProtocol.RemoteBlocks("tx3", "r3", new int[] {3, 4}, "decode-0", 0,
        0, new PeerProtocol.DoneWord(words.name(), 64, 5, 9)));
    PeerFixture.saveAllLayers(p, r);

    assertTrue(words.awaitAtLeast(5, 9, TimeUnit.SECONDS.toNanos(10)) > 0,
        "P's writer never stored D's word over " + kind);
    // The word is behind every layer's bytes: they are at D once it is seen.
    for (int l = 0; l < PeerFixture.LAYERS; l++) {
      for (int[] pair : new int[][] {{1, 3}, {2, 4}}) {
        assertEquals(block(fx.localLayers, l, pair[0]), block(fx.peerLayers, l, pair[1]),
            "layer " + l + " block " + pair[0] + " -> " + pair[1]);
      }
    }
    assertEquals("tx3", fishPeer(PeerProtocol.WriteDone.class).transferId(),
        "WriteDone still follows the word");
    assertEquals(0, words.get(4), "no other word was touched");
  }

  private static ByteBuffer block(List<MemoryRegion> layers, int layer, int block) {
    return layers.get(layer).buffer(block * PeerFixture.GEOMETRY.blockBytes(),
        (int) PeerFixture.GEOMETRY.blockBytes());
  }

  @Test
  void prefillStoresDecodesDoneWordBehindItsCmaWrites() throws Exception {
    prefillStoresTheWordBehindItsWrites("cma");
  }

  @Test
  void prefillStoresDecodesDoneWordBehindItsTcpWrites() throws Exception {
    prefillStoresTheWordBehindItsWrites("tcp");
  }
}
