package dev.kvferry.actors;

import org.apache.pekko.actor.Address;
import org.apache.pekko.actor.typed.ActorSystem;
import org.apache.pekko.cluster.Member;
import org.apache.pekko.cluster.MemberStatus;
import org.apache.pekko.cluster.typed.Cluster;
import org.jspecify.annotations.Nullable;

/** The cluster membership of other systems' addresses, for actors that must know it. */
final class ClusterMembers {

  private final ActorSystem<?> system;
  private final boolean clustered;

  ClusterMembers(ActorSystem<?> system) {
    this.system = system;
    // Pekko's resolved provider class ("cluster" in config and its class name both end here).
    this.clustered = system.settings().classicSettings().ProviderClass()
        .equals("org.apache.pekko.cluster.ClusterActorRefProvider");
  }

  /** The member status of {@code address}; null when it is no member or there is no cluster. */
  @Nullable MemberStatus statusOf(Address address) {
    if (!clustered) {
      return null;
    }
    for (Member member : Cluster.get(system).state().getMembers()) {
      if (member.address().equals(address)) {
        return member.status();
      }
    }
    return null;
  }

  /** Whether {@code address} is a member not (being) taken out: neither down nor on its way out. */
  boolean isIn(Address address) {
    MemberStatus status = statusOf(address);
    return status != null && status != MemberStatus.down() && status != MemberStatus.removed()
        && status != MemberStatus.exiting();
  }

  /** Whether {@code address} is a member that is up (or joining) and not leaving. */
  boolean isUp(Address address) {
    MemberStatus status = statusOf(address);
    return status == MemberStatus.up() || status == MemberStatus.weaklyUp()
        || status == MemberStatus.joining();
  }
}
