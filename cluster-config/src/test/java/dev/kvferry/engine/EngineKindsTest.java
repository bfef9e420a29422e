package dev.kvferry.engine;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvferry.actors.connector.Role;
import dev.kvferry.actors.connector.TransferMode;
import dev.kvferry.actors.plan.KvCacheGeometry;
import dev.kvferry.rdma.MemoryRegion;
import dev.kvferry.rdma.RegionKind;
import dev.kvferry.rdma.RegionRegistry;
import java.util.List;
import org.junit.jupiter.api.Test;

class EngineKindsTest {

  private static final KvCacheGeometry GEOMETRY = KvCacheGeometry.standard(8, 4, 2, 8, 2);

  @Test
  void unknownKindIsRefusedNamingTheKindsOnTheClassPath() {
    IllegalArgumentException e =
        assertThrows(IllegalArgumentException.class, () -> EngineKinds.named("vllm-magic"));
    assertTrue(e.getMessage().contains("kvferry.node.engine = \"vllm-magic\""), e.getMessage());
    assertTrue(e.getMessage().contains("available: none ("), e.getMessage());
  }

  @Test
  void idleEngineGivesEachRankZeroedHostLayersInItsOwnRegistry() {
    try (RegionRegistry r0 = new RegionRegistry("d/tp0");
        RegionRegistry r1 = new RegionRegistry("d/tp1")) {
      EngineSetup setup =
          new EngineSetup(Role.DECODE, "d", TransferMode.WRITE, GEOMETRY, 3, -1, List.of(r0, r1),
              com.typesafe.config.ConfigFactory.empty());
      try (EngineDriver driver = EngineKinds.named("none").create(setup)) {
        for (int rank = 0; rank < 2; rank++) {
          List<MemoryRegion> layers = driver.layerRegions(rank);
          assertEquals(3, layers.size());
          for (MemoryRegion layer : layers) {
            assertEquals(RegionKind.HOST, layer.kind());
            assertEquals(GEOMETRY.layerRegionBytes(), layer.lengthBytes());
            assertEquals(rank == 0 ? "d/tp0" : "d/tp1", layer.owner());
            byte[] bytes = new byte[(int) layer.lengthBytes()];
            new com.sun.jna.Pointer(layer.address()).read(0, bytes, 0, bytes.length);
            for (byte b : bytes) {
              assertEquals(0, b);
            }
          }
        }
      }
    }
  }
}
