package dev.kvferry.router;

import dev.kvferry.engine.HttpEndpoint;
import java.util.List;
import org.apache.pekko.actor.typed.ActorSystem;
import org.apache.pekko.actor.typed.Behavior;
import org.apache.pekko.actor.typed.Props;
import org.apache.pekko.actor.typed.javadsl.Behaviors;
import org.apache.pekko.actor.typed.receptionist.Receptionist;

/**
 * The engines serving HTTP that the cluster lists now ({@link HttpEndpoint#SERVICE_KEY}), kept
 * as a snapshot the proxy reads without asking: membership is the only source, so an engine that
 * detaches or whose node goes drops out as soon as the listing says so.
 */
final class EndpointDirectory {

  private volatile List<HttpEndpoint> listed = List.of();

  EndpointDirectory(ActorSystem<?> system) {
    Behavior<Receptionist.Listing> subscriber = Behaviors.setup(ctx -> {
      ctx.getSystem().receptionist().tell(
          Receptionist.subscribe(HttpEndpoint.SERVICE_KEY, ctx.getSelf()));
      return Behaviors.receive(Receptionist.Listing.class)
          .onMessage(Receptionist.Listing.class, l -> {
            listed = (l.getServiceInstances(HttpEndpoint.SERVICE_KEY).stream()
                .map(ref -> HttpEndpoint.fromActorName(ref.path().name()))
                .flatMap(java.util.Optional::stream)
                .sorted(java.util.Comparator.comparing(HttpEndpoint::engineId)
                    .thenComparingInt(HttpEndpoint::dpRank))
                .toList());
            return Behaviors.same();
          })
          .build();
    });
    system.systemActorOf(subscriber, "http-endpoint-directory", Props.empty());
  }

  List<HttpEndpoint> snapshot() {
    return listed;
  }
}
