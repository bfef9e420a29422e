package dev.kvferry.sim;

import dev.kvferry.actors.CborSerializable;
import dev.kvferry.actors.connector.KvTransferParams;
import dev.kvferry.actors.connector.Role;
import org.apache.pekko.actor.typed.ActorRef;
import org.apache.pekko.actor.typed.Behavior;
import org.apache.pekko.actor.typed.javadsl.Behaviors;
import org.apache.pekko.actor.typed.receptionist.Receptionist;
import org.apache.pekko.actor.typed.receptionist.ServiceKey;

/**
 * The simulated engine's mailbox in the cluster: routers submit requests here and ask for block
 * counts. It hands submissions to the engine's own loop thread, which replies when a request ends.
 */
public final class SimEngineActor {

  public static ServiceKey<Command> serviceKey(Role role) {
    return ServiceKey.create(Command.class, "kvferry-sim-" + role.clusterRole());
  }

  public sealed interface Command {}

  /** Run a request with these params; {@code replyTo} hears once when it ends on this engine. */
  public record Submit(RequestSpec spec, KvTransferParams params, ActorRef<Outcome> replyTo)
      implements Command, CborSerializable {}

  public record GetStats(ActorRef<Stats> replyTo) implements Command, CborSerializable {}

  /** How a request ended on one engine. */
  public record Outcome(
      String requestId,
      String engineId,
      Role role,
      Status status,
      KvTransferParams paramsForPeer,
      long bytes,
      long transferNanos,
      String detail)
      implements CborSerializable {

    public enum Status {
      /** P: prefill finished (and, READ, params for D are attached); D: KV received and verified. */
      DONE,
      ABORTED,
      /** The transfer failed; blocks were freed. */
      FAILED,
      /** D: bytes arrived but differ from what P computed. */
      MISMATCH
    }
  }

  /** Block accounting of one engine. */
  public record Stats(
      String engineId, Role role, int numBlocks, int freeBlocks, int requestsInFlight,
      long bytesMoved)
      implements CborSerializable {}

  public static Behavior<Command> create(SimulatedEngine engine) {
    return Behaviors.setup(
        ctx -> {
          ctx.getSystem()
              .receptionist()
              .tell(Receptionist.register(serviceKey(engine.role()), ctx.getSelf()));
          return Behaviors.receive(Command.class)
              .onMessage(
                  Submit.class,
                  m -> {
                    engine.submit(m);
                    return Behaviors.same();
                  })
              .onMessage(
                  GetStats.class,
                  m -> {
                    m.replyTo().tell(engine.stats());
                    return Behaviors.same();
                  })
              .build();
        });
  }

  private SimEngineActor() {}
}
