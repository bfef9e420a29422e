package dev.kvferry.actors;

import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvferry.actors.connector.ConnectorWorker;
import java.time.Duration;
import org.apache.pekko.actor.testkit.typed.javadsl.TestProbe;

/** Asks a worker for its transfers in flight (what /kvferry/transfers shows). */
final class TrackedTransfers {
  private TrackedTransfers() {}

  static void assertNone(PeerFixture fx, ConnectorWorker w) {
    TestProbe<TransferSnapshot> p = fx.kit.createTestProbe();
    w.engineRef().tell(new EngineActor.GetTransfers(p.ref()));
    TransferSnapshot s = p.receiveMessage(Duration.ofSeconds(5));
    assertTrue(s.transfers().isEmpty(), "still tracked: " + s.transfers());
  }

  static void assertCount(PeerFixture fx, ConnectorWorker w, int count) {
    TestProbe<TransferSnapshot> p = fx.kit.createTestProbe();
    w.engineRef().tell(new EngineActor.GetTransfers(p.ref()));
    TransferSnapshot s = p.receiveMessage(Duration.ofSeconds(5));
    org.junit.jupiter.api.Assertions.assertEquals(count, s.transfers().size(), s.transfers().toString());
  }
}
