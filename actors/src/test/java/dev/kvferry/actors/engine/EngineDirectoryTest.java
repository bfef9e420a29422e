package dev.kvferry.actors.engine;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvferry.actors.EngineActor;
import dev.kvferry.actors.connector.Role;
import dev.kvferry.actors.connector.TransferMode;
import java.util.List;
import org.apache.pekko.actor.testkit.typed.javadsl.ActorTestKit;
import org.apache.pekko.actor.typed.ActorRef;
import org.apache.pekko.actor.typed.Props;
import org.apache.pekko.actor.typed.javadsl.Behaviors;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;

/** Building the directory from listings: two engines under one id do not overwrite each other. */
class EngineDirectoryTest {

  private final ActorTestKit kit = ActorTestKit.create();

  @AfterEach
  void stop() {
    kit.shutdownTestKit();
  }

  @Test
  void twoEnginesWithOneIdAreReportedNamingBothAndEveryOrderKeepsTheSameOne() {
    EngineIdentity id = new EngineIdentity(Role.PREFILL, "prefill-0", 0, 1, 0, 1, TransferMode.WRITE);
    ActorRef<EngineActor.Command> a = kit.spawn(Behaviors.empty(), id.toActorName());
    ActorRef<EngineActor.Command> b =
        kit.system().systemActorOf(Behaviors.empty(), id.toActorName(), Props.empty());

    EngineDirectory ab = EngineDirectory.of(List.of(a, b));
    EngineDirectory ba = EngineDirectory.of(List.of(b, a));
    assertEquals(ab.find("prefill-0", 0).orElseThrow().ref(),
        ba.find("prefill-0", 0).orElseThrow().ref(), "which one is routed to depends on order");
    assertEquals(1, ab.duplicates().size());
    String message = ab.duplicates().get(0).message();
    assertTrue(message.contains(a.path().toString()) && message.contains(b.path().toString()),
        message);
    assertTrue(message.contains("prefill-0") && message.contains("own id"), message);
    assertEquals(ab.duplicates(), ab.merge(EngineDirectory.EMPTY).duplicates());
  }
}
