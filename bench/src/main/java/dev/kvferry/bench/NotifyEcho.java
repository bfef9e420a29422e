package dev.kvferry.bench;

import dev.kvferry.actors.EngineActor;
import dev.kvferry.actors.PeerProtocol;
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.concurrent.TimeUnit;
import org.apache.pekko.actor.typed.ActorRef;
import org.apache.pekko.actor.typed.ActorSystem;
import org.apache.pekko.actor.typed.Behavior;
import org.apache.pekko.actor.typed.javadsl.Behaviors;
import org.apache.pekko.actor.typed.receptionist.Receptionist;
import org.apache.pekko.actor.typed.receptionist.ServiceKey;

/**
 * The prefill side of the notify round trip, in its own JVM: answers every {@link
 * PeerProtocol.RemoteBlocks} with a {@link PeerProtocol.WriteDone} for the same transfer, as P does
 * once its writes are done (here with no bytes to write). It finds the decode side through the
 * Receptionist and registers itself only once it can answer.
 *
 * <p>Arguments: own Artery port, seed node's port. Prints {@code READY} once started; exits when
 * stdin closes.
 */
public final class NotifyEcho {

  /** The decode side (the pinger) registers here. */
  public static final ServiceKey<EngineActor.Command> DECODE_KEY =
      ServiceKey.create(EngineActor.Command.class, "kvferry-bench-notify-decode");

  /** The echo registers here once it knows the decode side. */
  public static final ServiceKey<EngineActor.Command> PREFILL_KEY =
      ServiceKey.create(EngineActor.Command.class, "kvferry-bench-notify-prefill");

  static final String SYSTEM_NAME = "kvferry-bench-notify";

  private NotifyEcho() {}

  /**
   * Waits for the decode side to be listed, then spawns the echo. The echo is a child because
   * Pekko's cluster receptionist refuses an actor that both subscribes and registers.
   */
  public static Behavior<Object> create() {
    return Behaviors.setup(ctx -> {
      ActorRef<Receptionist.Listing> listings = ctx.getSelf().narrow();
      ctx.getSystem().receptionist().tell(Receptionist.subscribe(DECODE_KEY, listings));
      return Behaviors.receive(Object.class)
          .onMessage(Receptionist.Listing.class, l -> {
            var decoders = l.getServiceInstances(DECODE_KEY);
            if (decoders.isEmpty()) {
              return Behaviors.same();
            }
            ctx.spawn(echo(decoders.iterator().next()), "echo");
            return Behaviors.receive(Object.class)
                .onMessage(Receptionist.Listing.class, ignored -> Behaviors.same())
                .build();
          })
          .build();
    });
  }

  /** Registers under {@link #PREFILL_KEY}, then answers every RemoteBlocks with a WriteDone. */
  private static Behavior<EngineActor.Command> echo(ActorRef<EngineActor.Command> decode) {
    return Behaviors.setup(ctx -> {
      ctx.getSystem().receptionist().tell(Receptionist.register(PREFILL_KEY, ctx.getSelf()));
      return Behaviors.receive(EngineActor.Command.class)
          .onMessage(PeerProtocol.RemoteBlocks.class, m -> {
            decode.tell(new PeerProtocol.WriteDone(m.transferId(), "bench-prefill", 0));
            return Behaviors.same();
          })
          .build();
    });
  }

  public static void main(String[] args) throws Exception {
    int port = Integer.parseInt(args[0]);
    int seedPort = Integer.parseInt(args[1]);
    ActorSystem<Object> system =
        ActorSystem.create(create(), SYSTEM_NAME, BenchCluster.nodeConfig(SYSTEM_NAME, port, seedPort));
    System.out.println("READY");
    System.out.flush();
    BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
    while (in.readLine() != null) {
      // the bench sends nothing; stdin closing is the signal to stop
    }
    system.terminate();
    system.getWhenTerminated().toCompletableFuture().get(20, TimeUnit.SECONDS);
    System.exit(0);
  }
}
