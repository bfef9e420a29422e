package dev.kvferry.node;

import dev.kvferry.router.ProxyServer;
import java.net.InetSocketAddress;
import java.util.Optional;
import org.jspecify.annotations.Nullable;

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

  private @Nullable ProxyServer proxy;

  private RouterNode(Config config) throws Exception {
    this.system = ActorSystem.create(Behaviors.empty(), "kvferry", config);
    NodeRuntime.register(this);
    this.router = system.systemActorOf(RouterActor.create(), "router", Props.empty());
    Config http = config.getConfig("kvferry.router.http");
    if (http.getInt("port") >= 0) {
      try {
        proxy = ProxyServer.start(system, new ProxyServer.Settings(http.getString("host"),
            http.getInt("port"), http.getInt("max-in-flight-per-engine"),
            http.getDuration("leg-timeout")), metrics.registry());
      } catch (Exception e) {
        close();
        throw e;
      }
    }
  }

  /** The proxy's address, when {@code kvferry.router.http.port} turned it on. */
  public Optional<InetSocketAddress> httpAddress() {
    ProxyServer p = proxy;
    return p == null ? Optional.empty() : Optional.of(p.address());
  }

  public static RouterNode start(Config config) throws Exception {
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
    ProxyServer p = proxy;
    if (p != null) {
      p.close();
    }
    NodeRuntime.unregister(this);
    system.terminate();
  }
}
