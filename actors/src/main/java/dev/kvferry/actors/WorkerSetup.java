package dev.kvferry.actors;

import dev.kvferry.actors.engine.ConnectorSettings;
import dev.kvferry.actors.engine.EngineIdentity;
import dev.kvferry.actors.plan.KvCacheGeometry;
import dev.kvferry.rdma.MemoryRegion;
import dev.kvferry.rdma.Transport;
import java.util.List;

/** Everything needed to start a worker ({@link EngineActor}) and the actors beside it. */
public record WorkerSetup(
    EngineIdentity identity,
    KvCacheGeometry geometry,
    List<MemoryRegion> layerRegions,
    Transport transport,
    ConnectorSettings settings,
    FinishedSink sink) {
  public WorkerSetup {
    layerRegions = List.copyOf(layerRegions);
    long need = geometry.layerRegionBytes();
    for (MemoryRegion r : layerRegions) {
      if (r.lengthBytes() < need) {
        throw new IllegalArgumentException(
            "layer region " + r.id() + " has " + r.lengthBytes() + " bytes; geometry needs "
                + need);
      }
    }
  }
}
