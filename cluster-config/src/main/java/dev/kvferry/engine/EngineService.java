package dev.kvferry.engine;

import dev.kvferry.actors.CborSerializable;
import dev.kvferry.actors.connector.KvTransferParams;
import dev.kvferry.actors.connector.Role;
import org.apache.pekko.actor.typed.ActorRef;
import org.apache.pekko.actor.typed.receptionist.ServiceKey;
import org.jspecify.annotations.Nullable;

/**
 * The mailbox every routable engine serves in the cluster, whatever drives it (the simulated
 * engine, or an engine process through the engine port): routers find it under {@link
 * #serviceKey(Role)}, submit requests and ask for block counts.
 */
public final class EngineService {

  public static ServiceKey<Command> serviceKey(Role role) {
    return ServiceKey.create(Command.class, "kvferry-routable-" + role.clusterRole());
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
      @Nullable KvTransferParams paramsForPeer,
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

  private EngineService() {}
}
