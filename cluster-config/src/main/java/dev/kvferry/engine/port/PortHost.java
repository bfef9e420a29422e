package dev.kvferry.engine.port;

import dev.kvferry.actors.connector.ConnectorScheduler;
import dev.kvferry.actors.connector.ConnectorWorker;
import dev.kvferry.actors.connector.Role;
import dev.kvferry.actors.connector.TransferMode;
import dev.kvferry.actors.engine.ConnectorSettings;
import dev.kvferry.actors.engine.EngineIdentity;
import dev.kvferry.rdma.RegionRegistry;
import java.io.IOException;
import java.util.List;
import org.apache.pekko.actor.typed.ActorSystem;

/**
 * What the engine port needs from the node that hosts it: the node's identity for engines, and a
 * worker with the node's transport. The node implements it, so the port does not depend on it.
 */
public interface PortHost {

  /** The node's id, for replies and logs. */
  String nodeName();

  ActorSystem<?> system();

  Role role();

  String engineId(TransferMode mode);

  int dpRank();

  int dpSize();

  int tpSize();

  List<TransferMode> modes();

  String transportName();

  /**
   * The CUDA device an engine's GPU memory (cuda_ipc) is opened on, or -1 when this node has no
   * GPU and serves host memory only.
   */
  default int gpu() {
    return -1;
  }

  ConnectorSettings connector();

  /** A worker for {@code id} whose transport reaches the regions of {@code registry}. */
  ConnectorWorker newWorker(EngineIdentity id, RegionRegistry registry) throws IOException;

  /** The engine's workers are registered and its scheduler made: list it with the node's. */
  void engineAttached(
      String engineId, TransferMode mode, List<ConnectorWorker> workers,
      ConnectorScheduler scheduler);

  /** The engine went (its workers stopped, their transports closed): take it off the list. */
  void engineDetached(String engineId);
}
