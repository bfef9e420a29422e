package dev.kvferry.actors;

import static org.junit.jupiter.api.Assertions.assertEquals;

import dev.kvferry.actors.connector.ConnectorWorker;
import dev.kvferry.actors.connector.Role;
import dev.kvferry.actors.connector.TransferMode;
import dev.kvferry.actors.engine.ConnectorSettings;
import dev.kvferry.actors.engine.EngineIdentity;
import java.time.Duration;
import java.util.List;
import java.util.concurrent.TimeUnit;
import org.apache.pekko.actor.testkit.typed.javadsl.TestProbe;
import org.apache.pekko.actor.typed.ActorRef;
import org.apache.pekko.actor.typed.receptionist.Receptionist;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;

/** Two workers started under one engine id and TP rank: one serves, the other is refused. */
class DuplicateEngineIdTest {

  private final PeerFixture fx = new PeerFixture();
  private final EngineIdentity id =
      new EngineIdentity(Role.DECODE, "decode-0", 0, 1, 0, 1, TransferMode.WRITE);

  @AfterEach
  void stop() {
    fx.close();
  }

  /** The workers listed under decode-0, once exactly one is (within 10 s). */
  private ActorRef<EngineActor.Command> theOneListed() {
    TestProbe<Receptionist.Listing> probe = fx.kit.createTestProbe();
    @SuppressWarnings({"unchecked", "rawtypes"})
    ActorRef<EngineActor.Command>[] one = new ActorRef[1];
    probe.awaitAssert(Duration.ofSeconds(10), () -> {
      fx.kit.system().receptionist()
          .tell(Receptionist.find(EngineActor.serviceKey(Role.DECODE), probe.ref()));
      List<ActorRef<EngineActor.Command>> listed =
          probe.receiveMessage().getServiceInstances(EngineActor.serviceKey(Role.DECODE)).stream()
              .filter(r -> r.path().name().equals(id.toActorName()))
              .toList();
      assertEquals(1, listed.size(), "listed under decode-0: " + listed);
      one[0] = listed.get(0);
      return null;
    });
    return one[0];
  }

  @Test
  void aSecondWorkerUnderOneEngineIdIsRefusedAndTakesOverWhenTheFirstIsGone() throws Exception {
    ConnectorWorker first = fx.worker(Role.DECODE, TransferMode.WRITE, "decode-0",
        ConnectorSettings.DEFAULTS);
    ActorRef<EngineActor.Command> second = fx.kit.spawn(
        EngineActor.create(new WorkerSetup(id, PeerFixture.GEOMETRY, fx.peerLayers,
            fx.transport, ConnectorSettings.DEFAULTS, new FinishedSink())),
        id.toActorName());
    ActorRef<EngineActor.Command> firstRef = first.engineRef();
    // Both registered; every node keeps the same one (the first by path) and the other leaves.
    // The two register independently: the listing may show either alone for a moment before
    // both are in it; it must settle on the first.
    fx.kit.createTestProbe().awaitAssert(Duration.ofSeconds(10), () -> {
      assertEquals(firstRef, theOneListed(), "the /system worker sorts first and is kept");
      return null;
    });
    fx.kit.createTestProbe().expectNoMessage(Duration.ofMillis(500));
    assertEquals(firstRef, theOneListed(), "the refused worker came back while the first serves");

    first.stop().get(10, TimeUnit.SECONDS);
    fx.kit.createTestProbe().awaitAssert(Duration.ofSeconds(10), () -> {
      assertEquals(second, theOneListed());
      return null;
    });
  }
}
