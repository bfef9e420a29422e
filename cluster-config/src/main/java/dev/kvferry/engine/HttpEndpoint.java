package dev.kvferry.engine;

import dev.kvferry.actors.connector.Role;
import dev.kvferry.actors.connector.TransferMode;
import java.net.URI;
import java.net.URLDecoder;
import java.net.URLEncoder;
import java.nio.charset.StandardCharsets;
import java.util.Optional;
import org.apache.pekko.actor.typed.ActorRef;
import org.apache.pekko.actor.typed.ActorSystem;
import org.apache.pekko.actor.typed.Behavior;
import org.apache.pekko.actor.typed.Props;
import org.apache.pekko.actor.typed.javadsl.Behaviors;
import org.apache.pekko.actor.typed.receptionist.Receptionist;
import org.apache.pekko.actor.typed.receptionist.ServiceKey;

/**
 * An engine that serves OpenAI-compatible HTTP (an engine process behind the engine port), as the
 * router's proxy sees it: who it is and its base URL. It is listed in the cluster under {@link
 * #SERVICE_KEY} by an actor whose name carries all of it, so a listing alone is enough to route,
 * and it leaves the listing when its engine detaches or its node goes.
 */
public record HttpEndpoint(
    Role role, String engineId, int dpRank, int dpSize, TransferMode mode, URI url) {

  public static final ServiceKey<Command> SERVICE_KEY =
      ServiceKey.create(Command.class, "kvferry-http-engine");

  private static final String PREFIX = "http";

  /** The listed actor takes one message: stop, when its engine goes. */
  public sealed interface Command {}

  private record Stop() implements Command {}

  public HttpEndpoint {
    String scheme = url.getScheme();
    if (!"http".equals(scheme) && !"https".equals(scheme) || url.getHost() == null) {
      throw new IllegalArgumentException("engine " + engineId + ": http_url must be an http(s)"
          + " URL with a host, got " + url);
    }
  }

  /**
   * The actor name this endpoint is listed under; {@link #fromActorName} reads it back. The last
   * part is unique per listing: an engine that comes back is listed while its old actor stops.
   */
  public String toActorName() {
    return String.join("~", PREFIX, role.clusterRole(), Integer.toString(dpRank),
        Integer.toString(dpSize), mode.configName(), encode(engineId), encode(url.toString()),
        Long.toHexString(java.util.concurrent.ThreadLocalRandom.current().nextLong()));
  }

  public static Optional<HttpEndpoint> fromActorName(String name) {
    String[] p = name.split("~");
    if (p.length != 8 || !p[0].equals(PREFIX)) {
      return Optional.empty();
    }
    try {
      return Optional.of(new HttpEndpoint(Role.parse(p[1]), decode(p[5]),
          Integer.parseInt(p[2]), Integer.parseInt(p[3]), TransferMode.parse(p[4]),
          URI.create(decode(p[6]))));
    } catch (IllegalArgumentException e) {
      return Optional.empty();
    }
  }

  /** Lists this endpoint in {@code system}'s cluster until {@link #unlist} is called. */
  public ActorRef<Command> list(ActorSystem<?> system) {
    Behavior<Command> b = Behaviors.setup(ctx -> {
      ctx.getSystem().receptionist().tell(Receptionist.register(SERVICE_KEY, ctx.getSelf()));
      return Behaviors.receive(Command.class)
          .onMessage(Stop.class, s -> Behaviors.stopped())
          .build();
    });
    return system.systemActorOf(b, toActorName(), Props.empty());
  }

  /** Takes an endpoint listed by {@link #list} off the listing. */
  public static void unlist(ActorRef<Command> listed) {
    listed.tell(new Stop());
  }

  private static String encode(String s) {
    // Actor names allow %-escapes but not "~" inside a part: URL-encoding keeps it out.
    return URLEncoder.encode(s, StandardCharsets.UTF_8).replace("~", "%7E");
  }

  private static String decode(String s) {
    return URLDecoder.decode(s, StandardCharsets.UTF_8);
  }
}
