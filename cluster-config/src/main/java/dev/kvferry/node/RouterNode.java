package dev.kvferry.node;

import com.typesafe.config.Config;
import dev.kvferry.actors.connector.ConnectorWorker;
import dev.kvferry.router.RouterActor;
import java.util.List;
import org.apache.pekko.actor.typed.ActorRef;
import org.apache.pekko.actor.typed.ActorSystem;
import org.apache.pekko.actor.typed.Props;
import org.apache.pekko.actor.typed.javadsl.Behaviors;

/** A router process: an actor system in the cluster with role router, running the RouterActor. */
public final class RouterNode implements NodeRuntime, AutoCloseable {

  private final ActorSystem<Void> system;
  private final NodeMetrics metrics = new NodeMetrics();
  private final ActorRef<RouterActor.Command> router;

  private RouterNode(Config config) {
    this.system = ActorSystem.create(Behaviors.empty(), "kvferry", config);
    NodeRuntime.register(this);
    this.router = system.systemActorOf(RouterActor.create(), "router", Props.empty());
  }

  public static RouterNode start(Config config) {
    return new RouterNode(config);
  }

  public ActorRef<RouterActor.Command> router() {
    return router;
  }

  @Override
  public String kind() {
    return "router";
  }

  @Override
  public ActorSystem<?> system() {
    return system;
  }

  @Override
  public List<ConnectorWorker> workers() {
    return List.of();
  }

  @Override
  public boolean transportBound() {
    return true;
  }

  @Override
  public boolean handshakeServed() {
    return true;
  }

  @Override
  public NodeMetrics metrics() {
    return metrics;
  }

  @Override
  public void close() {
    NodeRuntime.unregister(this);
    system.terminate();
  }
}
