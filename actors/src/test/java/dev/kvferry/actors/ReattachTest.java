package dev.kvferry.actors;

import static dev.kvferry.actors.TwoSystemClusterTest.BLOCK;
import static dev.kvferry.actors.TwoSystemClusterTest.D_GEOMETRY;
import static dev.kvferry.actors.TwoSystemClusterTest.LAYERS;
import static dev.kvferry.actors.TwoSystemClusterTest.P_GEOMETRY;
import static org.junit.jupiter.api.Assertions.assertEquals;

import dev.kvferry.actors.TwoSystemClusterTest.Side;
import dev.kvferry.actors.connector.ConnectorMetadata;
import dev.kvferry.actors.connector.ConnectorRequest;
import dev.kvferry.actors.connector.HostLayerEvent;
import dev.kvferry.actors.connector.KvTransferParams;
import dev.kvferry.actors.connector.Role;
import dev.kvferry.actors.connector.SchedulerOutput;
import dev.kvferry.actors.connector.TransferMode;
import java.util.ArrayList;
import java.util.List;
import java.util.Set;
import java.util.concurrent.TimeUnit;
import org.apache.pekko.actor.testkit.typed.javadsl.ActorTestKit;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;

/**
 * An engine that detaches and attaches again under the same id (a restarted vLLM worker, or the
 * engine port's attach after a detach) is reached at its new incarnation at once. Two clustered
 * systems with the Receptionist's default gossiped consistency, so the old worker stays listed on
 * D for up to a gossip round after it stopped: D must not leave its blocks with the dead one (they
 * would be lost and the request would fail at its timeout), but tell the new one.
 */
class ReattachTest {

  private final List<AutoCloseable> closeables = new ArrayList<>();
  private final ActorTestKit prefillSystem =
      ActorTestKit.create("kvferry", TwoSystemClusterTest.loopbackClusterConfig());
  private final ActorTestKit decodeSystem =
      ActorTestKit.create("kvferry", TwoSystemClusterTest.loopbackClusterConfig());

  @AfterEach
  void stop() throws Exception {
    for (AutoCloseable c : closeables) {
      c.close();
    }
    decodeSystem.shutdownTestKit();
    prefillSystem.shutdownTestKit();
  }

  /**
   * The engine detaches and attaches again at once, well inside the Receptionist's gossip round:
   * D may still route to the old worker, or tell it our blocks after it stopped; D then tells the
   * new incarnation (ReceiverActor.tellNewIncarnations).
   */
  @Test
  void aPrefillEngineAttachedAgainIsWrittenToByItsNewIncarnation() throws Exception {
    writeWhileAttachingAgain(Role.PREFILL, 1);
  }

  /**
   * WRITE requests while the engine of {@code attaching} (P or D) attaches three times under one
   * id, each incarnation stopped at once after its {@code requestsPerAttach} requests; the other
   * side's engine stays.
   */
  private void writeWhileAttachingAgain(Role attaching, int requestsPerAttach) throws Exception {
    TwoSystemClusterTest.formCluster(prefillSystem, decodeSystem);
    boolean prefillAttaches = attaching == Role.PREFILL;
    Side stays = prefillAttaches
        ? TwoSystemClusterTest.side(decodeSystem, closeables, Role.DECODE, TransferMode.WRITE,
            "decode-w", D_GEOMETRY)
        : TwoSystemClusterTest.side(prefillSystem, closeables, Role.PREFILL, TransferMode.WRITE,
            "prefill-w", P_GEOMETRY);
    int[] pBlocks = {2, 3, 4};
    int[] dBlocks = {7, 1, 30};
    for (int attach = 0; attach < 3; attach++) {
      Side again = prefillAttaches
          ? TwoSystemClusterTest.side(prefillSystem, closeables, Role.PREFILL, TransferMode.WRITE,
              "prefill-w", P_GEOMETRY)
          : TwoSystemClusterTest.side(decodeSystem, closeables, Role.DECODE, TransferMode.WRITE,
              "decode-w", D_GEOMETRY);
      for (int request = 0; request < requestsPerAttach; request++) {
        String id = requestsPerAttach == 1 ? "w" + attach : "w" + attach + "-" + request;
        writeOne(prefillAttaches ? again : stays, prefillAttaches ? stays : again, id, pBlocks,
            dBlocks);
      }
      again.worker().stop().get(10, TimeUnit.SECONDS);
    }
  }

  /** One WRITE request from P ("prefill-w") into D ("decode-w"), every byte checked. */
  private void writeOne(Side p, Side d, String id, int[] pBlocks, int[] dBlocks) {
    int prompt = pBlocks.length * BLOCK;
    ConnectorRequest dReq =
        new ConnectorRequest(id, prompt, KvTransferParams.forDecode("tx-" + id, "prefill-w", 0));
    ConnectorRequest pReq =
        new ConnectorRequest(id, prompt, KvTransferParams.forPrefill("tx-" + id, "decode-w", 0));
    d.scheduler().updateStateAfterAlloc(dReq, dBlocks, prompt);
    p.scheduler().updateStateAfterAlloc(pReq, pBlocks, 0);
    ConnectorMetadata meta = p.scheduler().buildConnectorMeta(new SchedulerOutput(
        List.of(new SchedulerOutput.NewRequest(id, pBlocks, prompt)), List.of()));
    for (int l = 0; l < LAYERS; l++) {
      p.worker().saveKvLayer(meta, l, HostLayerEvent.completed());
    }
    p.worker().waitForSave();
    assertEquals(Set.of(id), TwoSystemClusterTest.await(decodeSystem, d.worker(), false), id);
    assertEquals(Set.of(id), TwoSystemClusterTest.await(prefillSystem, p.worker(), true), id);
    TwoSystemClusterTest.assertMoved(p, d, pBlocks, dBlocks);
  }

  /**
   * WRITE the other way round: D's engine attaches again (new memory) while P may still list the
   * old incarnation; P must write into the new one's blocks, which announced them.
   */
  @Test
  void aDecodeEngineAttachedAgainIsWrittenToAtItsNewIncarnation() throws Exception {
    writeWhileAttachingAgain(Role.DECODE, 2); // the second request with what P kept of D
  }

  /**
   * READ: D keeps what it learned of P's worker (its regions) and reads from it at once next
   * time; after P attached again (new regions, new bytes) D must read the new incarnation's, not
   * what it kept of the old one.
   */
  @Test
  void aPrefillEngineAttachedAgainIsReadFromItsNewIncarnation() throws Exception {
    TwoSystemClusterTest.formCluster(prefillSystem, decodeSystem);
    Side d = TwoSystemClusterTest.side(decodeSystem, closeables, Role.DECODE, TransferMode.READ,
        "decode-r", D_GEOMETRY);
    int[] pBlocks = {2, 3, 4, 9};
    int[] dBlocks = {7, 1, 30, 12};
    int prompt = pBlocks.length * BLOCK + 1; // D computes the last token: it reads 4 blocks
    for (int attach = 0; attach < 3; attach++) {
      Side p = TwoSystemClusterTest.side(prefillSystem, closeables, Role.PREFILL,
          TransferMode.READ, "prefill-r", P_GEOMETRY);
      for (var layer : p.layers()) { // bytes of this incarnation only
        java.nio.ByteBuffer b = layer.buffer(0, (int) layer.lengthBytes());
        for (int i = 0; i < b.capacity(); i++) {
          b.put(i, (byte) (b.get(i) + 17 * (attach + 1)));
        }
      }
      for (int request = 0; request < 2; request++) { // the second one reads with what D kept
        String id = "r" + attach + "-" + request;
        ConnectorRequest pReq = new ConnectorRequest(id, prompt,
            KvTransferParams.forPrefill("tx-" + id, "decode-r", 0));
        pReq.setStatus(ConnectorRequest.Status.FINISHED_LENGTH_CAPPED);
        var decision = p.scheduler().requestFinished(pReq, pBlocks);
        p.worker().startLoadKv(
            p.scheduler().buildConnectorMeta(new SchedulerOutput(List.of(), List.of())));
        ConnectorRequest dReq = new ConnectorRequest(id, prompt, decision.paramsForPeer());
        d.scheduler().updateStateAfterAlloc(dReq, dBlocks, prompt - 1);
        d.worker().startLoadKv(
            d.scheduler().buildConnectorMeta(new SchedulerOutput(List.of(), List.of())));
        assertEquals(Set.of(id), TwoSystemClusterTest.await(decodeSystem, d.worker(), false),
            "attach " + attach + ", request " + request);
        assertEquals(Set.of(id), TwoSystemClusterTest.await(prefillSystem, p.worker(), true),
            "attach " + attach + ", request " + request);
        TwoSystemClusterTest.assertMoved(p, d, pBlocks, dBlocks);
      }
      p.worker().stop().get(10, TimeUnit.SECONDS);
    }
  }
}
