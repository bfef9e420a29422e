package dev.kvferry.sim;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assumptions.assumeTrue;

import com.sun.jna.Memory;
import com.sun.jna.Pointer;
import dev.kvferry.actors.connector.CudaLayerEvent;
import dev.kvferry.actors.connector.LayerEvent;
import dev.kvferry.actors.plan.KvCacheGeometry;
import dev.kvferry.rdma.MemoryRegion;
import dev.kvferry.rdma.RegionKind;
import dev.kvferry.rdma.RegionRegistry;
import dev.kvferry.rdma.cuda.Cuda;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Random;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

/**
 * The GPU cache's kernels against the one {@link KvPattern}: the fill kernel writes every byte of
 * every layer exactly as the host fill does (no other byte touched), and the verify kernel finds
 * the same first mismatch as the host check, for K/V and MLA layouts, heads of whole and of cut
 * words, and several TP ranks. Skipped without CUDA.
 */
class GpuKvCacheTest {

  private static final int LAYERS = 3;
  private final List<AutoCloseable> closeables = new ArrayList<>();

  @BeforeEach
  void requireCuda() {
    assumeTrue(Cuda.available(), () -> "CUDA not available: " + Cuda.unavailableReason());
  }

  @AfterEach
  void close() throws Exception {
    for (int i = closeables.size() - 1; i >= 0; i--) {
      closeables.get(i).close();
    }
  }

  /**
   * Geometries of one rank: head bytes 16 (whole words), 6 (a cut word, also blocks-first), MLA 24
   * and 10.
   */
  private static List<KvCacheGeometry> geometries() {
    return List.of(
        KvCacheGeometry.standard(16, 4, 2, 8, 2),
        KvCacheGeometry.standard(16, 4, 3, 3, 2),
        KvCacheGeometry.blocksFirst(16, 4, 3, 3, 2),
        KvCacheGeometry.mla(16, 4, 12, 2),
        KvCacheGeometry.mla(16, 4, 5, 2));
  }

  private record Pair(GpuKvCache gpu, HostKvCache host) {}

  private Pair caches(KvCacheGeometry g, int tp) {
    RegionRegistry gpuRegistry = new RegionRegistry("gpu");
    RegionRegistry hostRegistry = new RegionRegistry("host");
    closeables.add(hostRegistry);
    closeables.add(gpuRegistry);
    GpuKvCache gpu = new GpuKvCache(0, g, LAYERS, Collections.nCopies(tp, gpuRegistry));
    closeables.add(gpu);
    List<List<MemoryRegion>> byRank = new ArrayList<>();
    for (int rank = 0; rank < tp; rank++) {
      List<MemoryRegion> layers = new ArrayList<>();
      for (int l = 0; l < LAYERS; l++) {
        layers.add(hostRegistry.allocateHost(g.layerRegionBytes()));
      }
      byRank.add(layers);
    }
    return new Pair(gpu, new HostKvCache(g, byRank));
  }

  private static byte[] bytes(MemoryRegion r) {
    byte[] out = new byte[(int) r.lengthBytes()];
    if (r.kind() == RegionKind.CUDA) {
      try (Memory m = new Memory(r.lengthBytes())) {
        Cuda.setDevice(r.device());
        Cuda.memcpy(Pointer.nativeValue(m), r.address(), r.lengthBytes());
        m.read(0, out, 0, out.length);
      }
    } else {
      r.buffer(0, out.length).get(out);
    }
    return out;
  }

  private static void copyHostToGpu(Pair p) {
    for (int rank = 0; rank < p.host().ranks(); rank++) {
      for (int l = 0; l < LAYERS; l++) {
        MemoryRegion h = p.host().layerRegions(rank).get(l);
        Cuda.memcpy(p.gpu().layerRegions(rank).get(l).address(), h.address(), h.lengthBytes());
      }
    }
  }

  private static void assertSameBytes(Pair p, String what) {
    for (int rank = 0; rank < p.host().ranks(); rank++) {
      for (int l = 0; l < LAYERS; l++) {
        assertArrayEquals(bytes(p.host().layerRegions(rank).get(l)),
            bytes(p.gpu().layerRegions(rank).get(l)), what + ": rank " + rank + ", layer " + l);
      }
    }
  }

  private static void await(SimKvCache.Fence f) {
    long deadline = System.nanoTime() + 10_000_000_000L;
    while (!f.isComplete()) {
      assertTrue(System.nanoTime() < deadline, "GPU work did not finish in 10 s");
      Thread.onSpinWait();
    }
  }

  private static KvPattern.Mismatch awaitCheck(SimKvCache.Check c) {
    long deadline = System.nanoTime() + 10_000_000_000L;
    while (!c.isDone()) {
      assertTrue(System.nanoTime() < deadline, "GPU check did not finish in 10 s");
      Thread.onSpinWait();
    }
    return c.firstMismatch();
  }

  private static int[] shuffledBlocks(KvCacheGeometry g, Random r) {
    List<Integer> ids = new ArrayList<>();
    for (int i = 0; i < g.numBlocks(); i++) {
      ids.add(i);
    }
    Collections.shuffle(ids, r);
    return ids.stream().mapToInt(Integer::intValue).toArray();
  }

  @Test
  void forwardPassWritesExactlyTheHostPatternOnEveryRank() {
    for (KvCacheGeometry g : geometries()) {
      for (int tp : new int[] {1, 2}) {
        Pair p = caches(g, tp);
        Random random = new Random(3);
        int[] blocks = shuffledBlocks(g, random);
        int[] first = java.util.Arrays.copyOfRange(blocks, 0, 5);
        int[] second = java.util.Arrays.copyOfRange(blocks, 5, 9);
        // Two requests in one step: a chunk from the middle of one, the start of another.
        List<TokenRange> ranges = List.of(
            new TokenRange(KvPattern.requestKey("a"), first, 3, 19),
            new TokenRange(KvPattern.requestKey("b"), second, 0, 13));
        SimKvCache.ForwardPass gpuPass = p.gpu().forward(ranges);
        SimKvCache.ForwardPass hostPass = p.host().forward(ranges);
        for (int l = 0; l < LAYERS; l++) {
          for (int rank = 0; rank < tp; rank++) {
            LayerEvent e = gpuPass.layer(rank, l);
            assertTrue(e instanceof CudaLayerEvent, "a GPU layer hands the connector a CUDA event");
            hostPass.layer(rank, l);
          }
        }
        await(gpuPass.end());
        hostPass.end();
        assertSameBytes(p, g + ", TP " + tp);
      }
    }
  }

  @Test
  void prefixFillWritesExactlyTheHostPattern() {
    for (KvCacheGeometry g : geometries()) {
      Pair p = caches(g, 2);
      int[] blocks = shuffledBlocks(g, new Random(5));
      TokenRange prefix = new TokenRange(KvPattern.requestKey("prefix"), blocks, 0, 24);
      p.gpu().fill(prefix);
      p.host().fill(prefix);
      await(p.gpu().fence());
      assertSameBytes(p, g.toString());
    }
  }

  @Test
  void verifyKernelFindsTheSameFirstMismatchAsTheHost() {
    for (KvCacheGeometry g : geometries()) {
      for (int tp : new int[] {1, 2}) {
        Pair p = caches(g, tp);
        int[] blocks = shuffledBlocks(g, new Random(7));
        TokenRange all = new TokenRange(KvPattern.requestKey("req-7"), blocks, 0, 37);
        p.host().fill(all);
        copyHostToGpu(p);
        assertNull(awaitCheck(p.gpu().check(all)), g + ": a clean copy has no mismatch");
        Random random = new Random(11);
        for (int flip = 0; flip < 6; flip++) {
          // A byte somewhere in the request's tokens, on a random rank and layer.
          int rank = random.nextInt(tp);
          int layer = random.nextInt(LAYERS);
          int pos = random.nextInt(all.toToken());
          int kv = random.nextInt(KvPattern.slotsPerToken(g));
          long offset = KvPattern.slotOffset(g, blocks[pos / g.blockSize()], pos, kv)
              + random.nextInt(KvPattern.tokenBytes(g));
          MemoryRegion host = p.host().layerRegions(rank).get(layer);
          var b = host.buffer(offset, 1);
          b.put(0, (byte) (b.get(0) ^ (1 << random.nextInt(8))));
          copyHostToGpu(p);
          KvPattern.Mismatch expected = p.host().check(all).firstMismatch();
          KvPattern.Mismatch found = awaitCheck(p.gpu().check(all));
          assertNotNull(expected);
          assertEquals(expected, found, g + ", TP " + tp + ", after flip " + flip);
        }
      }
    }
  }

  @Test
  void stagingBuffersAreReusedOnceTheirKernelsAreDone() {
    KvCacheGeometry g = KvCacheGeometry.standard(64, 16, 8, 128, 2);
    Pair p = caches(g, 1);
    int[] blocks = shuffledBlocks(g, new Random(1));
    for (int step = 0; step < 200; step++) {
      TokenRange r = new TokenRange(KvPattern.requestKey("s" + step), blocks, 0, 1000);
      SimKvCache.ForwardPass pass = p.gpu().forward(List.of(r));
      for (int l = 0; l < LAYERS; l++) {
        pass.layer(0, l);
      }
      pass.end();
      if (step % 50 == 49) {
        assertNull(awaitCheck(p.gpu().check(r)), "step " + step);
      }
    }
  }
}
