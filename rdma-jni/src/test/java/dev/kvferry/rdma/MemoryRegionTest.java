package dev.kvferry.rdma;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.concurrent.atomic.AtomicInteger;
import org.junit.jupiter.api.Test;

class MemoryRegionTest {

  @Test
  void closingDuringATransferFreesTheMemoryOnlyAfterIt() {
    try (RegionRegistry registry = new RegionRegistry("E0")) {
      AtomicInteger frees = new AtomicInteger();
      MemoryRegion region =
          new MemoryRegion(
              registry, 42, 4096, 4096, RegionKind.HOST, -1, null, frees::incrementAndGet);
      assertTrue(region.tryPin());
      region.close();
      assertTrue(region.isClosed());
      assertEquals(0, frees.get(), "freed while a transfer still used it");
      assertFalse(region.tryPin(), "a closed region took a new transfer");
      region.unpin();
      assertEquals(1, frees.get());
      region.close();
      assertEquals(1, frees.get());
    }
  }

  @Test
  void closingAnIdleRegionFreesAndDeregistersAtOnce() {
    try (RegionRegistry registry = new RegionRegistry("E0")) {
      MemoryRegion region = registry.allocateHost(4096);
      int id = region.id();
      region.close();
      assertNull(registry.lookup(id));
      assertFalse(region.tryPin());
    }
  }
}
