package dev.kvferry.actors;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvferry.actors.connector.ConnectorRequest;
import dev.kvferry.actors.connector.ConnectorScheduler;
import dev.kvferry.actors.connector.ConnectorWorker;
import dev.kvferry.actors.connector.FinishDecision;
import dev.kvferry.actors.connector.Finished;
import dev.kvferry.actors.connector.KvTransferParams;
import dev.kvferry.actors.connector.LayerLoadOrder;
import dev.kvferry.actors.connector.Role;
import dev.kvferry.actors.connector.SchedulerOutput;
import dev.kvferry.actors.connector.TransferMode;
import dev.kvferry.actors.engine.ConnectorSettings;
import dev.kvferry.actors.engine.EngineIdentity;
import dev.kvferry.actors.plan.KvCacheGeometry;
import dev.kvferry.rdma.EventOrderedTransport;
import dev.kvferry.rdma.LocalTransport;
import dev.kvferry.rdma.MemoryRegion;
import dev.kvferry.rdma.RegionDescriptor;
import dev.kvferry.rdma.RegionRegistry;
import dev.kvferry.rdma.TransferBatch;
import dev.kvferry.rdma.TransferStatus;
import dev.kvferry.rdma.Transport;
import dev.kvferry.rdma.cuda.CudaEvent;
import java.nio.ByteBuffer;
import java.time.Clock;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Set;
import org.apache.pekko.actor.testkit.typed.javadsl.ActorTestKit;
import org.apache.pekko.actor.testkit.typed.javadsl.TestProbe;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

/**
 * D, READ, with a transport that orders copies on the GPU: {@code waitForLayerQueued} answers
 * while the layer's reads are still in flight, having recorded the event behind exactly those
 * reads; the CPU wait still waits for them to land. The copies are gated host copies standing in
 * for GPU copies after their submission returned (no CUDA here: the event is never touched).
 */
class LayerLoadEventTest {

  private static final int LAYERS = 3;
  private static final int BLOCK = 4;
  private static final KvCacheGeometry GEOMETRY = KvCacheGeometry.standard(16, BLOCK, 2, 8, 2);

  /** What the worker asked the transport to record: the event's place behind which reads. */
  private record Recorded(MemoryRegion local, List<RegionDescriptor> remotes) {}

  /** A gated transport that claims GPU ordering and keeps what it was asked to record. */
  private static final class OrderedGated implements EventOrderedTransport {
    final GatedTransport gated;
    final List<Recorded> recorded = new ArrayList<>();

    OrderedGated(Transport delegate) {
      this.gated = new GatedTransport(delegate);
    }

    @Override
    public synchronized void recordAfterCopies(
        CudaEvent event, MemoryRegion local, List<RegionDescriptor> remotes) {
      recorded.add(new Recorded(local, List.copyOf(remotes)));
    }

    synchronized List<Recorded> recorded() {
      return List.copyOf(recorded);
    }

    @Override
    public TransferStatus writeAfter(
        CudaEvent after, MemoryRegion local, RegionDescriptor remote, TransferBatch batch) {
      throw new UnsupportedOperationException("D reads");
    }

    @Override
    public TransferStatus readAfter(
        CudaEvent after, MemoryRegion local, RegionDescriptor remote, TransferBatch batch) {
      throw new UnsupportedOperationException("reads of a load wait for no event");
    }

    @Override
    public void signalWhenCopied(
        MemoryRegion local, RegionDescriptor remote, long wordDeviceAddress, long value) {
      throw new UnsupportedOperationException("no done words here");
    }

    @Override
    public String name() {
      return "ordered-gated";
    }

    @Override
    public TransferStatus write(MemoryRegion local, RegionDescriptor remote, TransferBatch batch) {
      return gated.write(local, remote, batch);
    }

    @Override
    public TransferStatus read(MemoryRegion local, RegionDescriptor remote, TransferBatch batch) {
      return gated.read(local, remote, batch);
    }

    @Override
    public RegionDescriptor describe(MemoryRegion local) {
      return gated.describe(local);
    }

    @Override
    public void close() {
      gated.close();
    }
  }

  private ActorTestKit kit;
  private RegionRegistry pRegistry;
  private RegionRegistry dRegistry;
  private final List<MemoryRegion> pLayers = new ArrayList<>();
  private final List<MemoryRegion> dLayers = new ArrayList<>();

  @BeforeEach
  void start() {
    kit = ActorTestKit.create();
    pRegistry = new RegionRegistry("prefill-0");
    dRegistry = new RegionRegistry("decode-0");
    for (int l = 0; l < LAYERS; l++) {
      MemoryRegion p = pRegistry.allocateHost(GEOMETRY.layerRegionBytes());
      ByteBuffer b = p.buffer(0, (int) p.lengthBytes());
      for (int i = 0; i < b.capacity(); i++) {
        b.put(i, (byte) (i * 13 + l + 1));
      }
      pLayers.add(p);
      dLayers.add(dRegistry.allocateHost(GEOMETRY.layerRegionBytes()));
    }
  }

  @AfterEach
  void stop() {
    kit.shutdownTestKit();
    pRegistry.close();
    dRegistry.close();
  }

  private ConnectorWorker worker(Role role, String id, List<MemoryRegion> layers,
      Transport transport) {
    ConnectorWorker w = new ConnectorWorker(kit.system(),
        new EngineIdentity(role, id, 0, 1, 0, 1, TransferMode.READ), transport,
        ConnectorSettings.DEFAULTS);
    w.registerKvCaches(GEOMETRY, layers);
    return w;
  }

  @Test
  void aQueuedLayerGetsItsEventBehindItsReadsBeforeTheyLand() throws Exception {
    ConnectorSettings s = ConnectorSettings.DEFAULTS;
    ConnectorWorker p = worker(Role.PREFILL, "prefill-0", pLayers,
        new LocalTransport(pRegistry, dRegistry));
    OrderedGated dTransport = new OrderedGated(new LocalTransport(pRegistry, dRegistry));
    ConnectorWorker d = worker(Role.DECODE, "decode-0", dLayers, dTransport);
    assertTrue(d.ordersLoadsOnGpu());
    ConnectorScheduler pSched = new ConnectorScheduler(Role.PREFILL, TransferMode.READ,
        "prefill-0", 0, BLOCK, List.of(p.engineRef()), s, Clock.systemUTC());
    ConnectorScheduler dSched = new ConnectorScheduler(Role.DECODE, TransferMode.READ,
        "decode-0", 0, BLOCK, List.of(d.engineRef()), s, Clock.systemUTC());

    int[] pBlocks = {2, 3};
    ConnectorRequest pReq =
        new ConnectorRequest("r", 8, KvTransferParams.forPrefill("tx-r", "decode-0", 0));
    pSched.updateStateAfterAlloc(pReq, pBlocks, 0);
    pSched.buildConnectorMeta(new SchedulerOutput(
        List.of(new SchedulerOutput.NewRequest("r", pBlocks)), List.of()));
    pReq.setStatus(ConnectorRequest.Status.FINISHED_LENGTH_CAPPED);
    FinishDecision fd = pSched.requestFinished(pReq, pBlocks);
    p.startLoadKv(pSched.buildConnectorMeta(new SchedulerOutput(List.of(), List.of())));

    ConnectorRequest dReq = new ConnectorRequest("r", 8, fd.paramsForPeer());
    dSched.numNewMatchedTokens(dReq, 0);
    int[] dBlocks = {7, 1};
    dSched.updateStateAfterAlloc(dReq, dBlocks, 7);
    d.startLoadKv(dSched.buildConnectorMeta(new SchedulerOutput(List.of(), List.of())));

    // The reads are queued but held: the event goes behind layer 1's one read, from P's layer 1.
    assertEquals(LayerLoadOrder.EVENT_RECORDED, d.waitForLayerQueued(1, null));
    List<Recorded> recorded = dTransport.recorded();
    assertEquals(1, recorded.size());
    assertSame(dLayers.get(1), recorded.get(0).local());
    assertEquals(List.of(pLayers.get(1).id()),
        recorded.get(0).remotes().stream().map(RegionDescriptor::regionId).toList());
    assertTrue(d.getFinished().isEmpty(), "nothing landed while the gate is shut");

    dTransport.gated.open();
    assertTrue(d.waitForLayerLoad(1));
    // Landed: nothing left in flight for the engine's stream to wait on.
    assertEquals(LayerLoadOrder.NOTHING_IN_FLIGHT, d.waitForLayerQueued(1, null));
    assertEquals(1, dTransport.recorded().size());
    assertEquals(Set.of("r"), awaitFinished(d).doneReceiving());
  }

  @Test
  void aStepWithoutLoadsAndATransportWithoutGpuOrderingRecordNothing() throws Exception {
    OrderedGated ordered = new OrderedGated(new LocalTransport(pRegistry, dRegistry));
    ConnectorWorker d = worker(Role.DECODE, "decode-0", dLayers, ordered);
    assertEquals(LayerLoadOrder.NOTHING_IN_FLIGHT, d.waitForLayerQueued(0, null));
    assertEquals(List.of(), ordered.recorded());

    ConnectorWorker host = worker(Role.DECODE, "decode-1", dLayers,
        new LocalTransport(pRegistry, dRegistry));
    assertFalse(host.ordersLoadsOnGpu());
    IllegalStateException e =
        assertThrows(IllegalStateException.class, () -> host.waitForLayerQueued(0, null));
    assertTrue(e.getMessage().contains("waitForLayerLoad"), e.getMessage());
  }

  private Finished awaitFinished(ConnectorWorker w) {
    List<Finished> seen = new ArrayList<>();
    TestProbe<Object> probe = kit.createTestProbe();
    probe.awaitAssert(Duration.ofSeconds(10), Duration.ofMillis(10), () -> {
      Finished f = w.getFinished();
      if (!f.isEmpty()) {
        seen.add(f);
      }
      assertFalse(seen.isEmpty(), "nothing finished yet on " + w.identity().label());
      return null;
    });
    return seen.get(0);
  }
}
