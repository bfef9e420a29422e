package dev.kvferry.management;

import dev.kvferry.node.NodeRuntime;
import java.util.Optional;
import org.apache.pekko.actor.typed.ActorSystem;
import org.apache.pekko.cluster.MemberStatus;
import org.apache.pekko.cluster.typed.Cluster;

/**
 * Whether this node should get traffic, and why not. Ready means: the node is an Up member of the
 * cluster, its data-plane transport is bound and every worker serves its handshake metadata. A
 * router has no transport and no workers; its runtime reports both as done.
 *
 * @param memberStatus this node's cluster member status ("Joining", "Up", ...)
 * @param runtimeRegistered a {@link NodeRuntime} is registered for the actor system
 */
public record Readiness(
    boolean ready,
    String memberStatus,
    boolean runtimeRegistered,
    boolean transportBound,
    boolean handshakeServed) {

  public static Readiness of(ActorSystem<?> system) {
    MemberStatus status = Cluster.get(system).selfMember().status();
    Optional<NodeRuntime> runtime = NodeRuntime.of(system);
    boolean bound = runtime.map(NodeRuntime::transportBound).orElse(false);
    boolean served = runtime.map(NodeRuntime::handshakeServed).orElse(false);
    boolean up = status == MemberStatus.up();
    return new Readiness(
        up && bound && served, status.toString(), runtime.isPresent(), bound, served);
  }

  /** One line for operators: what is missing. */
  public String explain() {
    if (ready) {
      return "ready";
    }
    StringBuilder b = new StringBuilder("not ready:");
    if (!"Up".equals(memberStatus)) {
      b.append(" cluster member status is ").append(memberStatus).append(", not Up;");
    }
    if (!runtimeRegistered) {
      b.append(" node runtime not started yet;");
    } else {
      if (!transportBound) {
        b.append(" data-plane transport not bound;");
      }
      if (!handshakeServed) {
        b.append(" handshake metadata not served by every worker;");
      }
    }
    return b.substring(0, b.length() - 1);
  }
}
