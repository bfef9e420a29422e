package dev.kvferry.management;

import dev.kvferry.actors.connector.ConnectorWorker;
import dev.kvferry.node.NodeMetrics;
import dev.kvferry.node.NodeRuntime;
import java.util.List;
import java.util.concurrent.CopyOnWriteArrayList;
import org.apache.pekko.actor.typed.ActorSystem;

/** A node runtime whose readiness the test sets by hand; its workers are real. */
final class TestRuntime implements NodeRuntime {

  private final ActorSystem<?> system;
  private final NodeMetrics metrics = new NodeMetrics();
  final List<ConnectorWorker> workers = new CopyOnWriteArrayList<>();
  volatile boolean transportBound;
  volatile boolean handshakeServed;

  TestRuntime(ActorSystem<?> system) {
    this.system = system;
  }

  @Override
  public String kind() {
    return "decode";
  }

  @Override
  public ActorSystem<?> system() {
    return system;
  }

  @Override
  public List<ConnectorWorker> workers() {
    return List.copyOf(workers);
  }

  @Override
  public boolean transportBound() {
    return transportBound;
  }

  @Override
  public boolean handshakeServed() {
    return handshakeServed;
  }

  @Override
  public NodeMetrics metrics() {
    return metrics;
  }
}
