package dev.kvferry.actors;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.typesafe.config.ConfigFactory;
import dev.kvferry.actors.connector.ConnectorMetadata;
import dev.kvferry.actors.connector.ConnectorRequest;
import dev.kvferry.actors.connector.ConnectorScheduler;
import dev.kvferry.actors.connector.ConnectorWorker;
import dev.kvferry.actors.connector.FinishDecision;
import dev.kvferry.actors.connector.Finished;
import dev.kvferry.actors.connector.HostLayerEvent;
import dev.kvferry.actors.connector.KvTransferParams;
import dev.kvferry.actors.connector.MatchedTokens;
import dev.kvferry.actors.connector.Role;
import dev.kvferry.actors.connector.SchedulerOutput;
import dev.kvferry.actors.connector.TransferMode;
import dev.kvferry.actors.engine.ConnectorSettings;
import dev.kvferry.actors.engine.EngineIdentity;
import dev.kvferry.actors.plan.KvCacheGeometry;
import dev.kvferry.rdma.LocalTransport;
import dev.kvferry.rdma.MemoryRegion;
import dev.kvferry.rdma.RegionRegistry;
import java.nio.ByteBuffer;
import java.time.Clock;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import org.apache.pekko.actor.testkit.typed.javadsl.ActorTestKit;
import org.apache.pekko.actor.testkit.typed.javadsl.TestProbe;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

/**
 * The connector end to end inside one actor system: a prefill worker and a decode worker with
 * their own registered caches, the local transport between them, and every byte compared.
 * Messages are serialized on every send, so the CBOR bindings are exercised too.
 */
class ConnectorFlowTest {

  private static final int LAYERS = 3;
  private static final int BLOCK = 4;
  private static final KvCacheGeometry P_GEOMETRY = KvCacheGeometry.standard(32, BLOCK, 2, 8, 2);
  private static final KvCacheGeometry D_GEOMETRY = KvCacheGeometry.standard(24, BLOCK, 2, 8, 2);

  private ActorTestKit kit;
  private RegionRegistry pRegistry;
  private RegionRegistry dRegistry;
  private final List<MemoryRegion> pLayers = new ArrayList<>();
  private final List<MemoryRegion> dLayers = new ArrayList<>();

  @BeforeEach
  void start() {
    kit =
        ActorTestKit.create(
            ConfigFactory.parseString("pekko.actor.serialize-messages = on")
                .withFallback(ConfigFactory.load()));
    pRegistry = new RegionRegistry("prefill-0");
    dRegistry = new RegionRegistry("decode-0");
    for (int l = 0; l < LAYERS; l++) {
      MemoryRegion p = pRegistry.allocateHost(P_GEOMETRY.layerRegionBytes());
      fill(p, l);
      pLayers.add(p);
      dLayers.add(dRegistry.allocateHost(D_GEOMETRY.layerRegionBytes()));
    }
  }

  @AfterEach
  void stop() {
    kit.shutdownTestKit();
    pRegistry.close();
    dRegistry.close();
  }

  private static void fill(MemoryRegion r, int layer) {
    ByteBuffer b = r.buffer(0, (int) r.lengthBytes());
    for (int i = 0; i < b.capacity(); i++) {
      b.put(i, (byte) (i * 31 + layer * 7 + 1));
    }
  }

  private ConnectorWorker worker(Role role, TransferMode mode, String id, KvCacheGeometry g,
      List<MemoryRegion> layers, ConnectorSettings settings) {
    ConnectorWorker w =
        new ConnectorWorker(
            kit.system(),
            new EngineIdentity(role, id, 0, 1, 0, 1, mode),
            new LocalTransport(pRegistry, dRegistry),
            settings);
    w.registerKvCaches(g, layers);
    return w;
  }

  /** D's block {@code d} of every layer, K and V, equals P's block {@code p}. */
  private void assertBlocksEqual(int[] pBlocks, int[] dBlocks) {
    long blockBytes = P_GEOMETRY.blockBytes();
    for (int l = 0; l < LAYERS; l++) {
      for (int i = 0; i < pBlocks.length; i++) {
        for (int kv = 0; kv < 2; kv++) {
          long pOff = kv * P_GEOMETRY.kToVStrideBytes() + pBlocks[i] * blockBytes;
          long dOff = kv * D_GEOMETRY.kToVStrideBytes() + dBlocks[i] * blockBytes;
          ByteBuffer pb = pLayers.get(l).buffer(pOff, (int) blockBytes);
          ByteBuffer db = dLayers.get(l).buffer(dOff, (int) blockBytes);
          assertEquals(pb, db, "layer " + l + " block p" + pBlocks[i] + "->d" + dBlocks[i] + " kv " + kv);
        }
      }
    }
  }

  private Finished awaitFinished(ConnectorWorker w) {
    Map<String, String> failed = new HashMap<>();
    List<Finished> seen = new ArrayList<>();
    TestProbe<Object> probe = kit.createTestProbe();
    probe.awaitAssert(
        Duration.ofSeconds(10),
        Duration.ofMillis(10),
        () -> {
          Finished f = w.getFinished();
          if (!f.isEmpty()) {
            seen.add(f);
          }
          assertTrue(!seen.isEmpty(), "nothing finished yet on " + w.identity().label());
          return null;
        });
    failed.putAll(seen.get(0).failed());
    return seen.get(0);
  }

  @Test
  void writeModeMovesEveryLayerAndReportsDoneOnBothSides() {
    ConnectorSettings s = ConnectorSettings.DEFAULTS;
    ConnectorWorker p = worker(Role.PREFILL, TransferMode.WRITE, "prefill-0", P_GEOMETRY, pLayers, s);
    ConnectorWorker d = worker(Role.DECODE, TransferMode.WRITE, "decode-0", D_GEOMETRY, dLayers, s);
    ConnectorScheduler pSched = new ConnectorScheduler(Role.PREFILL, TransferMode.WRITE, "prefill-0",
        0, BLOCK, List.of(p.engineRef()), s, Clock.systemUTC());
    ConnectorScheduler dSched = new ConnectorScheduler(Role.DECODE, TransferMode.WRITE, "decode-0",
        0, BLOCK, List.of(d.engineRef()), s, Clock.systemUTC());

    int prompt = 18; // 5 blocks of 4 tokens
    int[] pBlocks = {3, 4, 5, 9, 20};
    int[] dBlocks = {7, 8, 2, 3, 11};
    ConnectorRequest pReq = new ConnectorRequest("req-1", prompt, KvTransferParams.forPrefill("tx-1", "decode-0", 0));
    ConnectorRequest dReq = new ConnectorRequest("req-1", prompt, KvTransferParams.forDecode("tx-1", "prefill-0", 0));

    MatchedTokens matched = dSched.numNewMatchedTokens(dReq, 0);
    assertEquals(new MatchedTokens(prompt, true), matched);
    dSched.updateStateAfterAlloc(dReq, dBlocks, prompt);

    pSched.updateStateAfterAlloc(pReq, pBlocks, 0);
    ConnectorMetadata meta = pSched.buildConnectorMeta(new SchedulerOutput(
        List.of(new SchedulerOutput.NewRequest("req-1", pBlocks)), List.of()));
    assertEquals(1, meta.reqsToSave().size());
    for (int l = 0; l < LAYERS; l++) {
      HostLayerEvent e = new HostLayerEvent();
      p.saveKvLayer(meta, l, e);
      e.fire();
    }
    p.waitForSave();
    pReq.setStatus(ConnectorRequest.Status.FINISHED_LENGTH_CAPPED);
    FinishDecision fd = pSched.requestFinished(pReq, pBlocks);
    assertTrue(fd.delayFreeBlocks());

    assertEquals(Set.of("req-1"), awaitFinished(d).doneReceiving());
    assertEquals(Set.of("req-1"), awaitFinished(p).doneSending());
    assertBlocksEqual(pBlocks, dBlocks);
  }

  @Test
  void readModeReadsTheTailOnPrefixHitAndReleasesPrefill() {
    readTheTailOnPrefixHit(ConnectorSettings.DEFAULTS);
  }

  @Test
  void readsStartedAtAdmissionLandWithoutTheStepNamingThem() {
    readTheTailOnPrefixHit(ConnectorSettings.DEFAULTS.withReadsAtAdmission(true));
  }

  private void readTheTailOnPrefixHit(ConnectorSettings s) {
    ConnectorWorker p = worker(Role.PREFILL, TransferMode.READ, "prefill-0", P_GEOMETRY, pLayers, s);
    ConnectorWorker d = worker(Role.DECODE, TransferMode.READ, "decode-0", D_GEOMETRY, dLayers, s);
    ConnectorScheduler pSched = new ConnectorScheduler(Role.PREFILL, TransferMode.READ, "prefill-0",
        0, BLOCK, List.of(p.engineRef()), s, Clock.systemUTC());
    ConnectorScheduler dSched = new ConnectorScheduler(Role.DECODE, TransferMode.READ, "decode-0",
        0, BLOCK, List.of(d.engineRef()), s, Clock.systemUTC());

    int[] pBlocks = {10, 11, 12, 30};
    ConnectorRequest pReq = new ConnectorRequest("r", 16, KvTransferParams.forPrefill("tx-r", "decode-0", 0));
    pSched.updateStateAfterAlloc(pReq, pBlocks, 0);
    pSched.buildConnectorMeta(new SchedulerOutput(List.of(new SchedulerOutput.NewRequest("r", pBlocks)), List.of()));
    pReq.setStatus(ConnectorRequest.Status.FINISHED_LENGTH_CAPPED);
    FinishDecision fd = pSched.requestFinished(pReq, pBlocks);
    assertTrue(fd.delayFreeBlocks());
    p.startLoadKv(pSched.buildConnectorMeta(new SchedulerOutput(List.of(), List.of())));

    // D already has the first block cached: it allocates 3 and reads P's last 3.
    ConnectorRequest dReq = new ConnectorRequest("r", 16, fd.paramsForPeer());
    assertEquals(new MatchedTokens(11, true), dSched.numNewMatchedTokens(dReq, 4));
    int[] dBlocks = {5, 6, 1};
    dSched.updateStateAfterAlloc(dReq, dBlocks, 11);
    ConnectorMetadata step = dSched.buildConnectorMeta(new SchedulerOutput(List.of(), List.of()));
    assertEquals(s.readsAtAdmission() ? 0 : 1, step.reqsToRecv().size(),
        "reads started at admission are not the step's to start");
    d.startLoadKv(step);

    assertEquals(Set.of("r"), awaitFinished(d).doneReceiving());
    assertEquals(Set.of("r"), awaitFinished(p).doneSending());
    assertBlocksEqual(new int[] {11, 12, 30}, dBlocks);
  }
}
