package dev.kvferry.management;

import static dev.kvferry.node.PekkoFutures.plain;

import dev.kvferry.actors.EngineActor;
import dev.kvferry.actors.connector.Role;
import dev.kvferry.actors.engine.EngineIdentity;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.List;
import java.util.Optional;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionStage;
import org.apache.pekko.actor.Address;
import org.apache.pekko.actor.typed.ActorRef;
import org.apache.pekko.actor.typed.ActorSystem;
import org.apache.pekko.actor.typed.javadsl.AskPattern;
import org.apache.pekko.actor.typed.receptionist.Receptionist;
import org.apache.pekko.actor.typed.receptionist.ServiceKey;
import org.apache.pekko.cluster.typed.Cluster;

/**
 * One engine worker as {@code GET /kvferry/engines} shows it: who it is (read from the name it
 * registered under) and the cluster address of the node it runs on.
 */
public record EngineView(
    String role, String engineId, int dpRank, int tpRank, String mode, String address) {

  private static final Comparator<EngineView> ORDER =
      Comparator.comparing(EngineView::role)
          .thenComparing(EngineView::engineId)
          .thenComparingInt(EngineView::dpRank)
          .thenComparingInt(EngineView::tpRank);

  /**
   * Every engine worker the Receptionist lists, prefill and decode, in a stable order. Works on any
   * node: the cluster Receptionist replicates listings to every member, the router included.
   */
  public static CompletionStage<List<EngineView>> listAll(ActorSystem<?> system, Duration timeout) {
    CompletableFuture<List<EngineView>> prefill = list(system, Role.PREFILL, timeout);
    CompletableFuture<List<EngineView>> decode = list(system, Role.DECODE, timeout);
    return prefill.thenCombine(
        decode,
        (p, d) -> {
          List<EngineView> all = new ArrayList<>(p);
          all.addAll(d);
          all.sort(ORDER);
          return all;
        });
  }

  private static CompletableFuture<List<EngineView>> list(
      ActorSystem<?> system, Role role, Duration timeout) {
    ServiceKey<EngineActor.Command> key = EngineActor.serviceKey(role);
    Address self = selfAddress(system);
    return plain(AskPattern.<Receptionist.Command, Receptionist.Listing>ask(
            system.receptionist(),
            replyTo -> Receptionist.find(key, replyTo),
            timeout,
            system.scheduler()))
        .thenApply(
            listing -> {
              List<EngineView> views = new ArrayList<>();
              for (ActorRef<EngineActor.Command> ref : listing.getServiceInstances(key)) {
                of(ref, self).ifPresent(views::add);
              }
              return views;
            });
  }

  /** Empty for a ref whose name is not an engine identity (not registered by kvferry). */
  static Optional<EngineView> of(ActorRef<?> ref, Address selfAddress) {
    Address address = ref.path().address();
    // Refs of this node's own workers carry a local address ("pekko://kvferry"): show the
    // node's cluster address instead, so every line names a reachable node.
    String where = (address.hasGlobalScope() ? address : selfAddress).toString();
    return EngineIdentity.fromActorName(ref.path().name())
        .map(
            id ->
                new EngineView(
                    id.role().clusterRole(),
                    id.engineId(),
                    id.dpRank(),
                    id.tpRank(),
                    id.mode().configName(),
                    where));
  }

  private static Address selfAddress(ActorSystem<?> system) {
    return Cluster.get(system).selfMember().address();
  }
}
