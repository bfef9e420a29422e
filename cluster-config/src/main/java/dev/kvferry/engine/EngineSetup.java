package dev.kvferry.engine;

import com.typesafe.config.Config;
import dev.kvferry.actors.connector.Role;
import dev.kvferry.actors.connector.TransferMode;
import dev.kvferry.actors.plan.KvCacheGeometry;
import dev.kvferry.rdma.RegionRegistry;
import java.util.List;

/**
 * What an {@link EngineKind} needs to make one engine's driver.
 *
 * @param gpu the CUDA device the KV cache lives on, or -1 for host memory
 * @param rankRegistries per TP rank, in rank order, the registry its layer regions join
 * @param nodeConfig the node's {@code kvferry.node} section: a kind reads its own settings there
 */
public record EngineSetup(
    Role role,
    String engineId,
    TransferMode mode,
    KvCacheGeometry geometry,
    int layers,
    int gpu,
    List<RegionRegistry> rankRegistries,
    Config nodeConfig) {

  public EngineSetup {
    rankRegistries = List.copyOf(rankRegistries);
  }

  public boolean onGpu() {
    return gpu >= 0;
  }
}
