package dev.kvferry.actors;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvferry.actors.connector.ConnectorWorker;
import dev.kvferry.actors.connector.Finished;
import dev.kvferry.actors.connector.ReqMeta;
import dev.kvferry.actors.connector.Role;
import dev.kvferry.actors.connector.TransferMode;
import dev.kvferry.actors.engine.ConnectorSettings;
import java.time.Duration;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;

/** Messages between engines that arrive in an order the happy path never sees. */
class MessageOrderTest {

  private final PeerFixture fx = new PeerFixture();

  @AfterEach
  void stop() {
    fx.close();
  }

  @Test
  void decodeFailsAtOnceWhenPrefillsAbortOvertakesItsBlockAnnouncement() {
    // P aborts the request and says so before D's scheduler got to announce its blocks. The
    // transfer timeout is far away: the failure must come from P's message, not from the clock.
    ConnectorSettings s = ConnectorSettings.DEFAULTS.withTransferTimeout(Duration.ofMinutes(10));
    ConnectorWorker d = fx.worker(Role.DECODE, TransferMode.WRITE, "decode-0", s);
    d.engineRef().tell(new PeerProtocol.TransferFailed("tx-1", "prefill-0", "request r1 aborted on prefill", 0));
    d.engineRef()
        .tell(new EngineActor.AnnounceRemoteBlocks(
            new ReqMeta("r1", "tx-1", new int[] {1, 2}, null, "prefill-0", 0)));

    Finished f = fx.awaitFinished(d, x -> x.failed().containsKey("r1"));
    assertTrue(f.failed().get("r1").contains("aborted on prefill"), f.failed().toString());
    assertTrue(f.doneReceiving().isEmpty());

    // The next transfer with a fresh id is tracked normally (and times out only by its deadline).
    d.engineRef()
        .tell(new EngineActor.AnnounceRemoteBlocks(
            new ReqMeta("r2", "tx-2", new int[] {3}, null, "prefill-0", 0)));
    d.engineRef().tell(new PeerProtocol.WriteDone("tx-2", "prefill-0", 0));
    assertEquals(java.util.Set.of("r2"), fx.awaitFinished(d, x -> !x.doneReceiving().isEmpty()).doneReceiving());
  }
}
