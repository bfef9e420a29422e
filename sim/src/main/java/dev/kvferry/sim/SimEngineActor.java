package dev.kvferry.sim;

import dev.kvferry.engine.EngineService;
import dev.kvferry.engine.EngineService.Command;
import dev.kvferry.engine.EngineService.GetStats;
import dev.kvferry.engine.EngineService.Submit;
import org.apache.pekko.actor.typed.Behavior;
import org.apache.pekko.actor.typed.javadsl.Behaviors;
import org.apache.pekko.actor.typed.receptionist.Receptionist;

/**
 * The simulated engine's {@link EngineService} mailbox: hands submissions to the engine's own loop
 * thread, which replies when a request ends.
 */
public final class SimEngineActor {

  public static Behavior<Command> create(SimulatedEngine engine) {
    return Behaviors.setup(
        ctx -> {
          ctx.getSystem()
              .receptionist()
              .tell(Receptionist.register(EngineService.serviceKey(engine.role()), ctx.getSelf()));
          return Behaviors.receive(Command.class)
              .onMessage(Submit.class, m -> onSubmit(engine, m))
              .onMessage(GetStats.class, m -> onGetStats(engine, m))
              .build();
        });
  }

  private static Behavior<Command> onSubmit(SimulatedEngine engine, Submit m) {
    engine.submit(m);
    return Behaviors.same();
  }

  private static Behavior<Command> onGetStats(SimulatedEngine engine, GetStats m) {
    m.replyTo().tell(engine.stats());
    return Behaviors.same();
  }

  private SimEngineActor() {}
}
