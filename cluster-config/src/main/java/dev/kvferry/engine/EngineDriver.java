package dev.kvferry.engine;

import dev.kvferry.actors.connector.ConnectorScheduler;
import dev.kvferry.actors.connector.ConnectorWorker;
import dev.kvferry.rdma.MemoryRegion;
import java.util.List;
import org.apache.pekko.actor.typed.ActorSystem;

/**
 * Drives one engine of a node: owns its KV cache and calls the connector's scheduler and worker
 * sides. Made by an {@link EngineKind}; the node registers {@link #layerRegions(int)} with each TP
 * rank's worker, then calls {@link #start}.
 */
public interface EngineDriver extends AutoCloseable {

  /** TP rank {@code rank}'s layer regions, to register with its worker. */
  List<MemoryRegion> layerRegions(int rank);

  /**
   * Starts calling the connector. An engine that takes requests from routers registers its
   * {@link EngineService} mailbox in {@code system} here.
   *
   * @param workers one per TP rank, in rank order, each with its layers registered
   */
  void start(ActorSystem<?> system, ConnectorScheduler scheduler, List<ConnectorWorker> workers);

  /** Stops driving; called before the node stops the workers. */
  void stop();

  /** Gives the KV cache back; called after the workers and their transfers are gone. */
  @Override
  void close();
}
