package dev.kvferry.sim;

import dev.kvferry.engine.RequestSpec;
import dev.kvferry.engine.EngineService;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.typesafe.config.ConfigFactory;
import dev.kvferry.actors.connector.ConnectorScheduler;
import dev.kvferry.actors.connector.ConnectorWorker;
import dev.kvferry.actors.connector.KvTransferParams;
import dev.kvferry.actors.connector.Role;
import dev.kvferry.actors.connector.TransferMode;
import dev.kvferry.actors.engine.ConnectorSettings;
import dev.kvferry.actors.engine.EngineIdentity;
import dev.kvferry.actors.plan.KvCacheGeometry;
import dev.kvferry.rdma.LocalTransport;
import dev.kvferry.rdma.MemoryRegion;
import dev.kvferry.rdma.RegionDescriptor;
import dev.kvferry.rdma.RegionRegistry;
import dev.kvferry.rdma.TransferBatch;
import dev.kvferry.rdma.TransferStatus;
import dev.kvferry.rdma.Transport;
import dev.kvferry.engine.EngineService.Outcome;
import java.time.Clock;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.atomic.AtomicBoolean;
import org.apache.pekko.actor.testkit.typed.javadsl.ActorTestKit;
import org.apache.pekko.actor.testkit.typed.javadsl.TestProbe;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;

/**
 * The simulated engines on both sides in one actor system, over the local transport: chunked
 * prefill, prefix hits on D, different num_blocks, both modes, and the verifier catching a byte
 * flipped in transit. {@link GpuSimulatedEngineTest} runs the same cases with the caches on a GPU.
 */
class SimulatedEngineTest {

  static final int LAYERS = 3;
  private final ActorTestKit kit =
      ActorTestKit.create(ConfigFactory.parseString("pekko.loglevel = WARNING")
          .withFallback(ConfigFactory.load()));
  /** Closed in this order, each list in order: engines first, registries and transports last. */
  private final List<AutoCloseable> engines = new ArrayList<>();
  private final List<AutoCloseable> connectorWorkers = new ArrayList<>();
  private final List<AutoCloseable> caches = new ArrayList<>();
  private final List<AutoCloseable> closeables = new ArrayList<>();

  @AfterEach
  void stop() throws Exception {
    for (List<AutoCloseable> group : List.of(engines, connectorWorkers, caches, closeables)) {
      for (AutoCloseable c : group) {
        c.close();
      }
    }
    kit.shutdownTestKit();
  }

  /** The transport between P and D, which reach {@code prefill} and {@code decode}. */
  Transport transport(RegionRegistry prefill, RegionRegistry decode) {
    return new LocalTransport(prefill, decode);
  }

  /** A cache of {@link #LAYERS} layers of {@code g} per rank, its regions in {@code registry}. */
  SimKvCache cache(KvCacheGeometry g, int tp, RegionRegistry registry) {
    List<List<MemoryRegion>> byRank = new ArrayList<>();
    for (int rank = 0; rank < tp; rank++) {
      List<MemoryRegion> layers = new ArrayList<>();
      for (int l = 0; l < LAYERS; l++) {
        layers.add(registry.allocateHost(g.layerRegionBytes()));
      }
      byRank.add(layers);
    }
    return new HostKvCache(g, byRank);
  }

  /** Flips bit 6 of the byte at {@code offset} of {@code region}. */
  void flipByte(MemoryRegion region, long offset) {
    var buf = region.buffer(offset, 1);
    buf.put(0, (byte) (buf.get(0) ^ 0x40));
  }

  /** Flips one byte of the destination once the first write of a batch has landed. */
  private final class CorruptingTransport implements Transport {
    private final Transport inner;
    private final RegionRegistry destination;
    private final AtomicBoolean done = new AtomicBoolean();

    CorruptingTransport(Transport inner, RegionRegistry destination) {
      this.inner = inner;
      this.destination = destination;
    }

    @Override
    public String name() {
      return inner.name();
    }

    @Override
    public TransferStatus write(MemoryRegion local, RegionDescriptor remote, TransferBatch batch) {
      TransferStatus s = inner.write(local, remote, batch);
      if (batch.count() == 0 || done.getAndSet(true)) {
        return s;
      }
      // Reported done only after the flip, so D checks the corrupted bytes.
      TransferStatus corrupted = TransferStatus.pending();
      s.completion().whenComplete((status, error) -> {
        if (status != null && status.succeeded()) {
          flipByte(destination.lookup(remote.regionId()), batch.remoteOffsets()[0] + 5);
          corrupted.succeed(status.bytesMoved());
        } else {
          corrupted.fail(status != null ? status.failureMessage() : String.valueOf(error));
        }
      });
      return corrupted;
    }

    @Override
    public TransferStatus read(MemoryRegion local, RegionDescriptor remote, TransferBatch batch) {
      return inner.read(local, remote, batch);
    }

    @Override
    public RegionDescriptor describe(MemoryRegion local) {
      return inner.describe(local);
    }

    @Override
    public void close() {}
  }

  private record Pair(SimulatedEngine prefill, SimulatedEngine decode) {}

  /**
   * A fresh P and D. Each pair gets engine ids of its own: a test that starts two pairs in one
   * actor system would otherwise let D's handshake find the first pair's P (both alive until
   * {@link #stop}) and read regions this pair's transport cannot reach.
   */
  private Pair start(TransferMode mode, KvCacheGeometry pGeometry, KvCacheGeometry dGeometry,
      boolean corrupt) {
    String suffix = engines.isEmpty() ? "" : "-" + engines.size() / 2;
    RegionRegistry pRegistry = new RegionRegistry("prefill");
    RegionRegistry dRegistry = new RegionRegistry("decode");
    closeables.add(pRegistry);
    closeables.add(dRegistry);
    Transport between = transport(pRegistry, dRegistry);
    closeables.add(between);
    Transport pTransport = corrupt ? new CorruptingTransport(between, dRegistry) : between;
    SimulatedEngine p =
        tpEngine(Role.PREFILL, mode, "prefill" + suffix, pGeometry, 1, pRegistry, pTransport);
    SimulatedEngine d =
        tpEngine(Role.DECODE, mode, "decode" + suffix, dGeometry, 1, dRegistry, between);
    return new Pair(p, d);
  }

  /**
   * P with TP size {@code tpP} and D with {@code tpD}; each geometry is one rank's (its kvHeads are
   * the rank's share of the heads).
   */
  private Pair startShapes(String name, TransferMode mode, KvCacheGeometry pRank, int tpP,
      KvCacheGeometry dRank, int tpD) {
    RegionRegistry pRegistry = new RegionRegistry("prefill");
    RegionRegistry dRegistry = new RegionRegistry("decode");
    closeables.add(pRegistry);
    closeables.add(dRegistry);
    Transport between = transport(pRegistry, dRegistry);
    closeables.add(between);
    return new Pair(
        tpEngine(Role.PREFILL, mode, "prefill-" + name, pRank, tpP, pRegistry, between),
        tpEngine(Role.DECODE, mode, "decode-" + name, dRank, tpD, dRegistry, between));
  }

  private SimulatedEngine tpEngine(Role role, TransferMode mode, String id, KvCacheGeometry g,
      int tp, RegionRegistry registry, Transport transport) {
    ConnectorSettings settings = ConnectorSettings.DEFAULTS.withTransferTimeout(Duration.ofSeconds(20));
    SimKvCache cache = cache(g, tp, registry);
    List<ConnectorWorker> workers = new ArrayList<>();
    for (int rank = 0; rank < tp; rank++) {
      ConnectorWorker w = new ConnectorWorker(kit.system(),
          new EngineIdentity(role, id, 0, 1, rank, tp, mode), transport, settings);
      w.registerKvCaches(g, cache.layerRegions(rank));
      workers.add(w);
      connectorWorkers.add(w);
    }
    ConnectorScheduler s = new ConnectorScheduler(role, mode, id, 0, g.blockSize(),
        workers.stream().map(ConnectorWorker::engineRef).toList(), settings, Clock.systemUTC());
    SimulatedEngine e = new SimulatedEngine(role, id, g, cache, s, workers, 40, 7,
        SimulatedEngine.LayerListener.NONE);
    e.start();
    engines.add(e);
    caches.add(cache);
    return e;
  }

  /** Runs one request the way the router does; returns D's outcome. */
  private Outcome run(Pair pair, TransferMode mode, RequestSpec spec) {
    TestProbe<Outcome> pProbe = kit.createTestProbe();
    TestProbe<Outcome> dProbe = kit.createTestProbe();
    String tx = "tx-" + spec.requestId();
    pair.prefill().submit(new EngineService.Submit(spec,
        KvTransferParams.forPrefill(tx, pair.decode().engineId(), 0), pProbe.ref()));
    if (mode == TransferMode.WRITE) {
      pair.decode().submit(new EngineService.Submit(spec,
          KvTransferParams.forDecode(tx, pair.prefill().engineId(), 0), dProbe.ref()));
      pProbe.expectMessageClass(Outcome.class, Duration.ofSeconds(20));
    } else {
      Outcome p = pProbe.expectMessageClass(Outcome.class, Duration.ofSeconds(20));
      if (p.status() != Outcome.Status.DONE) {
        return p; // READ: D is only involved once P has prefilled
      }
      pair.decode().submit(new EngineService.Submit(spec, p.paramsForPeer(), dProbe.ref()));
    }
    return dProbe.expectMessageClass(Outcome.class, Duration.ofSeconds(20));
  }

  private void awaitAllFree(SimulatedEngine e) {
    kit.createTestProbe().awaitAssert(Duration.ofSeconds(10), () -> {
      EngineService.Stats s = e.stats();
      assertEquals(s.numBlocks(), s.freeBlocks(), e.engineId() + " leaked blocks");
      return null;
    });
  }

  private void verifiesEveryRequest(TransferMode mode, KvCacheGeometry p, KvCacheGeometry d) {
    Pair pair = start(mode, p, d, false);
    int[] prompts = {1, 4, 5, 39, 40, 41, 97, 130};
    for (int i = 0; i < prompts.length; i++) {
      int cached = i % 3 == 2 ? (prompts[i] / 2 / p.blockSize()) * p.blockSize() : 0;
      Outcome o = run(pair, mode, new RequestSpec("r" + i, prompts[i], cached, RequestSpec.Abort.NONE));
      assertEquals(Outcome.Status.DONE, o.status(), "request r" + i + ": " + o.detail());
    }
    awaitAllFree(pair.prefill());
    awaitAllFree(pair.decode());
  }

  @Test
  void writeModeVerifiesChunkedPrefillsAndPrefixHitsWithDifferentNumBlocks() {
    verifiesEveryRequest(TransferMode.WRITE, KvCacheGeometry.standard(64, 4, 2, 8, 2),
        KvCacheGeometry.standard(48, 4, 2, 8, 2));
  }

  @Test
  void readModeVerifiesChunkedPrefillsAndPrefixHitsWithDifferentNumBlocks() {
    verifiesEveryRequest(TransferMode.READ, KvCacheGeometry.standard(48, 4, 2, 8, 2),
        KvCacheGeometry.standard(64, 4, 2, 8, 2));
  }

  @Test
  void mlaLayoutVerifiesInBothModes() {
    verifiesEveryRequest(TransferMode.WRITE, KvCacheGeometry.mla(64, 4, 12, 2), KvCacheGeometry.mla(40, 4, 12, 2));
    verifiesEveryRequest(TransferMode.READ, KvCacheGeometry.mla(40, 4, 12, 2), KvCacheGeometry.mla(64, 4, 12, 2));
  }

  @Test
  void blocksFirstLayoutVerifiesInBothModesAndBesideAStandardPeer() {
    verifiesEveryRequest(TransferMode.WRITE, KvCacheGeometry.blocksFirst(64, 4, 2, 8, 2),
        KvCacheGeometry.blocksFirst(40, 4, 2, 8, 2));
    verifiesEveryRequest(TransferMode.READ, KvCacheGeometry.standard(40, 4, 2, 8, 2),
        KvCacheGeometry.blocksFirst(64, 4, 2, 8, 2));
  }

  private static final int HEADS = 4;

  private static KvCacheGeometry rank(boolean mla, int numBlocks, int blockSize, int tp) {
    return mla
        ? KvCacheGeometry.mla(numBlocks, blockSize, 12, 2)
        : KvCacheGeometry.standard(numBlocks, blockSize, HEADS / tp, 8, 2);
  }

  /**
   * Every request of a mix of prompt lengths (chunked prefill included) arrives byte for byte at
   * D, in both modes and both layouts, and both sides end with every block free. Prefix hits on D
   * are included when the block sizes are equal.
   */
  private void verifiesEveryRequestAcrossShapes(int tpP, int blockP, int tpD, int blockD) {
    for (boolean mla : new boolean[] {false, true}) {
      for (TransferMode mode : TransferMode.values()) {
        String name = tpP + "x" + blockP + "-" + tpD + "x" + blockD + (mla ? "-mla-" : "-std-") + mode;
        Pair pair = startShapes(name, mode, rank(mla, 64, blockP, tpP), tpP,
            rank(mla, 48, blockD, tpD), tpD);
        int[] prompts = {1, 4, 5, 39, 40, 41, 97};
        for (int i = 0; i < prompts.length; i++) {
          int cached =
              blockP == blockD && i % 3 == 2 ? (prompts[i] / 2 / blockD) * blockD : 0;
          String id = (mla ? "mla-" : "std-") + mode + "-r" + i;
          Outcome o = run(pair, mode, new RequestSpec(id, prompts[i], cached, RequestSpec.Abort.NONE));
          assertEquals(Outcome.Status.DONE, o.status(),
              "TP " + tpP + "->" + tpD + ", blocks " + blockP + "->" + blockD + ", request " + id
                  + ": " + o.detail());
        }
        awaitAllFree(pair.prefill());
        awaitAllFree(pair.decode());
      }
    }
  }

  @Test
  void tpTwoToOneVerifiesEveryByte() {
    verifiesEveryRequestAcrossShapes(2, 4, 1, 4);
  }

  @Test
  void tpOneToTwoVerifiesEveryByte() {
    verifiesEveryRequestAcrossShapes(1, 4, 2, 4);
  }

  @Test
  void tpFourToTwoVerifiesEveryByte() {
    verifiesEveryRequestAcrossShapes(4, 4, 2, 4);
  }

  @Test
  void smallerPrefillBlocksVerifyEveryByte() {
    verifiesEveryRequestAcrossShapes(1, 4, 1, 8);
  }

  @Test
  void largerPrefillBlocksVerifyEveryByte() {
    verifiesEveryRequestAcrossShapes(1, 8, 1, 4);
  }

  @Test
  void differentTpAndBlockSizesTogetherVerifyEveryByte() {
    verifiesEveryRequestAcrossShapes(2, 4, 1, 8);
    verifiesEveryRequestAcrossShapes(1, 8, 2, 4);
  }

  @Test
  void incompatibleShapesFailTheTransferNamingBothSidesValues() {
    for (TransferMode mode : TransferMode.values()) {
      Pair pair = startShapes("bad-dim-" + mode, mode, KvCacheGeometry.standard(64, 4, 2, 8, 2), 2,
          KvCacheGeometry.standard(64, 8, 4, 16, 2), 1);
      Outcome o = run(pair, mode, new RequestSpec("bad-" + mode, 30, 0, RequestSpec.Abort.NONE));
      assertEquals(Outcome.Status.FAILED, o.status(), o.detail());
      assertTrue(o.detail().contains("head_dim is ") && o.detail().contains(" 8 on ")
          && o.detail().contains(" 16 on "), o.detail());
      awaitAllFree(pair.prefill());
      awaitAllFree(pair.decode());
    }
  }

  @Test
  void abortsOnEitherSideFreeEveryBlockOnBothSides() {
    for (TransferMode mode : TransferMode.values()) {
      Pair pair = start(mode, KvCacheGeometry.standard(64, 4, 2, 8, 2),
          KvCacheGeometry.standard(64, 4, 2, 8, 2), false);
      int i = 0;
      for (RequestSpec.Abort abort : RequestSpec.Abort.values()) {
        RequestSpec spec = new RequestSpec(mode + "-" + abort + "-" + i++, 97, 0, abort);
        Outcome o = run(pair, mode, spec);
        if (abort == RequestSpec.Abort.NONE) {
          assertEquals(Outcome.Status.DONE, o.status(), o.detail());
        } else {
          // Never a mismatch, never done: an aborted request ends aborted (or failed, where the
          // other side learns of the abort as a failed transfer).
          assertTrue(o.status() == Outcome.Status.ABORTED || o.status() == Outcome.Status.FAILED,
              abort + " in " + mode + " ended " + o.status() + ": " + o.detail());
        }
      }
      awaitAllFree(pair.prefill());
      awaitAllFree(pair.decode());
    }
  }

  @Test
  void verifierNamesTheByteFlippedInTransit() {
    Pair pair = start(TransferMode.WRITE, KvCacheGeometry.standard(64, 4, 2, 8, 2),
        KvCacheGeometry.standard(64, 4, 2, 8, 2), true);
    Outcome o = run(pair, TransferMode.WRITE, new RequestSpec("victim", 30, 0, RequestSpec.Abort.NONE));
    assertEquals(Outcome.Status.MISMATCH, o.status(), o.detail());
    assertTrue(o.detail().contains("request victim") && o.detail().contains("layer ")
        && o.detail().contains("block ") && o.detail().contains("byte offset"), o.detail());
    awaitAllFree(pair.decode());
  }
}
