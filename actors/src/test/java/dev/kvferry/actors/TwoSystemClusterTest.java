package dev.kvferry.actors;

import static org.junit.jupiter.api.Assertions.assertEquals;

import com.typesafe.config.Config;
import com.typesafe.config.ConfigFactory;
import dev.kvferry.actors.connector.ConnectorMetadata;
import dev.kvferry.actors.connector.ConnectorRequest;
import dev.kvferry.actors.connector.ConnectorScheduler;
import dev.kvferry.actors.connector.ConnectorWorker;
import dev.kvferry.actors.connector.FinishDecision;
import dev.kvferry.actors.connector.HostLayerEvent;
import dev.kvferry.actors.connector.KvTransferParams;
import dev.kvferry.actors.connector.Role;
import dev.kvferry.actors.connector.SchedulerOutput;
import dev.kvferry.actors.connector.TransferMode;
import dev.kvferry.actors.engine.ConnectorSettings;
import dev.kvferry.actors.engine.EngineIdentity;
import dev.kvferry.actors.plan.KvCacheGeometry;
import dev.kvferry.rdma.MemoryRegion;
import dev.kvferry.rdma.RegionRegistry;
import dev.kvferry.rdma.TransportOptions;
import dev.kvferry.rdma.Transports;
import java.nio.ByteBuffer;
import java.time.Clock;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Set;
import org.apache.pekko.actor.testkit.typed.javadsl.ActorTestKit;
import org.apache.pekko.cluster.MemberStatus;
import org.apache.pekko.cluster.typed.Cluster;
import org.apache.pekko.cluster.typed.Join;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;

/**
 * Two actor systems that form a Pekko cluster on loopback, P in one and D in the other: the whole
 * protocol (Receptionist discovery, handshake, remote blocks, write done, release) over Artery
 * with CBOR, the bytes over CMA, every byte compared at D, in both modes.
 */
class TwoSystemClusterTest {

  static final int LAYERS = 4;
  static final int BLOCK = 16;
  static final KvCacheGeometry P_GEOMETRY = KvCacheGeometry.standard(64, BLOCK, 2, 16, 2);
  static final KvCacheGeometry D_GEOMETRY = KvCacheGeometry.standard(80, BLOCK, 2, 16, 2);

  private final List<AutoCloseable> closeables = new ArrayList<>();
  private final ActorTestKit prefillSystem = ActorTestKit.create("kvferry", clusterConfig());
  private final ActorTestKit decodeSystem = ActorTestKit.create("kvferry", clusterConfig());

  private static Config clusterConfig() {
    return ConfigFactory.parseString("pekko.cluster.typed.receptionist.write-consistency = all")
        .withFallback(loopbackClusterConfig());
  }

  /** A cluster node on loopback with the Receptionist's default (gossiped) consistency. */
  static Config loopbackClusterConfig() {
    return ConfigFactory.parseString(String.join("\n",
            "pekko.actor.provider = cluster",
            "pekko.remote.artery.canonical.hostname = 127.0.0.1",
            "pekko.remote.artery.canonical.port = 0",
            "pekko.cluster.jmx.multi-mbeans-in-same-jvm = on",
            "pekko.loglevel = WARNING"))
        .withFallback(ConfigFactory.load());
  }

  @AfterEach
  void stop() throws Exception {
    for (AutoCloseable c : closeables) {
      c.close();
    }
    decodeSystem.shutdownTestKit();
    prefillSystem.shutdownTestKit();
  }

  private void formCluster() {
    formCluster(prefillSystem, decodeSystem);
  }

  static void formCluster(ActorTestKit prefillSystem, ActorTestKit decodeSystem) {
    Cluster p = Cluster.get(prefillSystem.system());
    Cluster d = Cluster.get(decodeSystem.system());
    p.manager().tell(Join.create(p.selfMember().address()));
    d.manager().tell(Join.create(p.selfMember().address()));
    prefillSystem.createTestProbe().awaitAssert(Duration.ofSeconds(20), () -> {
      assertEquals(MemberStatus.up(), p.selfMember().status());
      assertEquals(MemberStatus.up(), d.selfMember().status());
      return null;
    });
  }

  record Side(ConnectorWorker worker, ConnectorScheduler scheduler, List<MemoryRegion> layers) {}

  private Side side(ActorTestKit kit, Role role, TransferMode mode, String id, KvCacheGeometry g)
      throws Exception {
    return side(kit, closeables, role, mode, id, g);
  }

  /** A worker and scheduler over host layers (P's filled with a pattern); closed with the test. */
  static Side side(ActorTestKit kit, List<AutoCloseable> closeables, Role role, TransferMode mode,
      String id, KvCacheGeometry g) throws Exception {
    RegionRegistry registry = new RegionRegistry(id);
    closeables.add(registry);
    List<MemoryRegion> layers = new ArrayList<>();
    for (int l = 0; l < LAYERS; l++) {
      MemoryRegion r = registry.allocateHost(g.layerRegionBytes());
      if (role == Role.PREFILL) {
        ByteBuffer b = r.buffer(0, (int) r.lengthBytes());
        for (int i = 0; i < b.capacity(); i++) {
          b.put(i, (byte) (i * 13 + l * 5 + 3));
        }
      }
      layers.add(r);
    }
    ConnectorWorker w = new ConnectorWorker(kit.system(),
        new EngineIdentity(role, id, 0, 1, 0, 1, mode),
        Transports.open("cma", registry, TransportOptions.defaults()), ConnectorSettings.DEFAULTS);
    closeables.add(0, w);
    w.registerKvCaches(g, layers);
    ConnectorScheduler s = new ConnectorScheduler(role, mode, id, 0, BLOCK, List.of(w.engineRef()),
        ConnectorSettings.DEFAULTS, Clock.systemUTC());
    return new Side(w, s, layers);
  }

  static void assertMoved(Side p, Side d, int[] pBlocks, int[] dBlocks) {
    for (int l = 0; l < LAYERS; l++) {
      for (int i = 0; i < pBlocks.length; i++) {
        for (int kv = 0; kv < 2; kv++) {
          long pOff = kv * P_GEOMETRY.kToVStrideBytes() + pBlocks[i] * P_GEOMETRY.blockBytes();
          long dOff = kv * D_GEOMETRY.kToVStrideBytes() + dBlocks[i] * D_GEOMETRY.blockBytes();
          assertEquals(p.layers().get(l).buffer(pOff, (int) P_GEOMETRY.blockBytes()),
              d.layers().get(l).buffer(dOff, (int) D_GEOMETRY.blockBytes()),
              "layer " + l + " block " + pBlocks[i] + "->" + dBlocks[i] + (kv == 0 ? " K" : " V"));
        }
      }
    }
  }

  static Set<String> await(ActorTestKit kit, ConnectorWorker w, boolean sending) {
    Set<String> got = new java.util.HashSet<>();
    kit.createTestProbe().awaitAssert(Duration.ofSeconds(20), Duration.ofMillis(10), () -> {
      var f = w.getFinished();
      got.addAll(sending ? f.doneSending() : f.doneReceiving());
      assertEquals(Set.of(), f.failed().keySet());
      assertEquals(1, got.size(), "nothing finished yet on " + w.identity().label());
      return null;
    });
    return got;
  }

  @Test
  void writeAndReadModesMoveEveryByteBetweenTwoClusteredSystems() throws Exception {
    formCluster();
    // WRITE: D announces its blocks, P writes each layer as it is computed.
    Side pw = side(prefillSystem, Role.PREFILL, TransferMode.WRITE, "prefill-w", P_GEOMETRY);
    Side dw = side(decodeSystem, Role.DECODE, TransferMode.WRITE, "decode-w", D_GEOMETRY);
    int[] pBlocks = {2, 3, 4, 40, 9};
    int[] dBlocks = {70, 1, 2, 3, 33};
    int prompt = 5 * BLOCK;
    ConnectorRequest dReq = new ConnectorRequest("w1", prompt, KvTransferParams.forDecode("tx-w1", "prefill-w", 0));
    ConnectorRequest pReq = new ConnectorRequest("w1", prompt, KvTransferParams.forPrefill("tx-w1", "decode-w", 0));
    dw.scheduler().updateStateAfterAlloc(dReq, dBlocks, prompt);
    pw.scheduler().updateStateAfterAlloc(pReq, pBlocks, 0);
    ConnectorMetadata meta = pw.scheduler().buildConnectorMeta(new SchedulerOutput(
        List.of(new SchedulerOutput.NewRequest("w1", pBlocks, prompt)), List.of()));
    for (int l = 0; l < LAYERS; l++) {
      pw.worker().saveKvLayer(meta, l, HostLayerEvent.completed());
    }
    pw.worker().waitForSave();
    assertEquals(Set.of("w1"), await(decodeSystem, dw.worker(), false));
    assertEquals(Set.of("w1"), await(prefillSystem, pw.worker(), true));
    assertMoved(pw, dw, pBlocks, dBlocks);

    // READ: P keeps its blocks, D reads them (the tail, D having the first block cached).
    Side pr = side(prefillSystem, Role.PREFILL, TransferMode.READ, "prefill-r", P_GEOMETRY);
    Side dr = side(decodeSystem, Role.DECODE, TransferMode.READ, "decode-r", D_GEOMETRY);
    ConnectorRequest p2 = new ConnectorRequest("r1", prompt, KvTransferParams.forPrefill("tx-r1", "decode-r", 0));
    p2.setStatus(ConnectorRequest.Status.FINISHED_LENGTH_CAPPED);
    FinishDecision fd = pr.scheduler().requestFinished(p2, pBlocks);
    pr.worker().startLoadKv(pr.scheduler().buildConnectorMeta(new SchedulerOutput(List.of(), List.of())));
    ConnectorRequest d2 = new ConnectorRequest("r1", prompt, fd.paramsForPeer());
    int[] dTail = {5, 6, 7, 8};
    dr.scheduler().updateStateAfterAlloc(d2, dTail, prompt - BLOCK - 1);
    dr.worker().startLoadKv(dr.scheduler().buildConnectorMeta(new SchedulerOutput(List.of(), List.of())));
    assertEquals(Set.of("r1"), await(decodeSystem, dr.worker(), false));
    assertEquals(Set.of("r1"), await(prefillSystem, pr.worker(), true));
    assertMoved(pr, dr, new int[] {3, 4, 40, 9}, dTail);
  }
}
