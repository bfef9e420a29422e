package dev.kvferry.node;

import dev.kvferry.actors.connector.ConnectorWorker;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.concurrent.ConcurrentHashMap;
import org.apache.pekko.actor.typed.ActorSystem;

/**
 * What a running kvferry process (engine node or router) exposes to management endpoints. One per
 * actor system; routes created by Pekko Management (by reflection, from the system alone) find it
 * with {@link #of(ActorSystem)}.
 */
public interface NodeRuntime {

  /** "prefill", "decode" or "router". */
  String kind();

  ActorSystem<?> system();

  /** This node's engine workers (one per TP rank); empty on a router. */
  List<ConnectorWorker> workers();

  /** True once the data-plane transport is bound (always true on a router). */
  boolean transportBound();

  /** True once every worker serves its handshake metadata (always true on a router). */
  boolean handshakeServed();

  /** Metrics of this process (Prometheus). */
  NodeMetrics metrics();

  /** The runtime registered for a system, if any. */
  static Optional<NodeRuntime> of(ActorSystem<?> system) {
    return Optional.ofNullable(Registry.RUNTIMES.get(system.name() + "@" + System.identityHashCode(system)));
  }

  static void register(NodeRuntime runtime) {
    ActorSystem<?> s = runtime.system();
    Registry.RUNTIMES.put(s.name() + "@" + System.identityHashCode(s), runtime);
  }

  static void unregister(NodeRuntime runtime) {
    ActorSystem<?> s = runtime.system();
    Registry.RUNTIMES.remove(s.name() + "@" + System.identityHashCode(s));
  }

  /** Holder of the process-wide map (interfaces cannot have private static fields). */
  final class Registry {
    private static final Map<String, NodeRuntime> RUNTIMES = new ConcurrentHashMap<>();

    private Registry() {}
  }
}
