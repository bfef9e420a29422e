package dev.kvferry.actors.plan;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvferry.rdma.TransferBatch;
import java.util.Arrays;
import java.util.Random;
import net.jqwik.api.Arbitraries;
import net.jqwik.api.Arbitrary;
import net.jqwik.api.Combinators;
import net.jqwik.api.ForAll;
import net.jqwik.api.Property;
import net.jqwik.api.Provide;
import net.jqwik.api.Tuple;

class TransferPlannerPropertiesTest {

  /** Shared across tries on purpose: scratch left dirty by one call would break a later one. */
  private static final TransferPlanner PLANNER = new TransferPlanner();

  /** How the block ids of a generated request are arranged. */
  enum Shape {
    /** One or more runs, contiguous on both sides, in order. */
    RUNS,
    /** Runs as above, then shuffled as whole blocks. */
    SHUFFLED_RUNS,
    /** Distinct ids drawn at random on each side, in random order. */
    SCATTERED,
    /** Scattered, then sorted by local id. */
    SCATTERED_SORTED,
    /** Every block at both edges of the cache, so K's last block can meet V's first. */
    EDGES
  }

  record PlanCase(KvCacheGeometry geometry, int remoteNumBlocks, int[] local, int[] remote) {
    @Override
    public String toString() {
      return geometry
          + " remoteNumBlocks="
          + remoteNumBlocks
          + " local="
          + Arrays.toString(local)
          + " remote="
          + Arrays.toString(remote);
    }
  }

  @Property(tries = 2000)
  void matchesTheSeedOnValidIds(@ForAll("cases") PlanCase c) throws InvalidBlockIdsException {
    TransferBatch expected =
        SeedReferencePlanner.plan(c.geometry(), c.remoteNumBlocks(), c.local(), c.remote());
    TransferBatch actual = PLANNER.plan(c.geometry(), c.remoteNumBlocks(), c.local(), c.remote());
    assertArrayEquals(expected.localOffsets(), actual.localOffsets(), "local offsets");
    assertArrayEquals(expected.remoteOffsets(), actual.remoteOffsets(), "remote offsets");
    assertArrayEquals(expected.sizes(), actual.sizes(), "sizes");
  }

  @Property(tries = 500)
  void movesEveryBlockExactlyOnce(@ForAll("cases") PlanCase c) throws InvalidBlockIdsException {
    TransferBatch batch = PLANNER.plan(c.geometry(), c.remoteNumBlocks(), c.local(), c.remote());
    KvCacheGeometry g = c.geometry();
    assertEquals(
        (long) c.local().length * g.regionsPerLayer() * g.blockBytes(), batch.totalBytes());
    for (int i = 0; i < batch.count(); i++) {
      long end = batch.localOffsets()[i] + batch.sizes()[i];
      assertEquals(0, batch.sizes()[i] % g.blockBytes());
      assertTrue(end <= g.layerRegionBytes(), "copy " + i + " ends inside the layer");
      if (i > 0) {
        long previousEnd = batch.localOffsets()[i - 1] + batch.sizes()[i - 1];
        assertTrue(batch.localOffsets()[i] >= previousEnd, "copies do not overlap");
      }
    }
  }

  @Property(tries = 300)
  void staysCorrectAfterRejectingARepeatedId(@ForAll("cases") PlanCase c)
      throws InvalidBlockIdsException {
    int n = c.local().length;
    if (n >= 2) {
      int[] repeated = c.local().clone();
      repeated[n - 1] = repeated[0];
      assertThrows(
          InvalidBlockIdsException.class,
          () -> PLANNER.plan(c.geometry(), c.remoteNumBlocks(), repeated, c.remote()));
      int[] repeatedRemote = c.remote().clone();
      repeatedRemote[n - 1] = repeatedRemote[0];
      assertThrows(
          InvalidBlockIdsException.class,
          () -> PLANNER.plan(c.geometry(), c.remoteNumBlocks(), c.local(), repeatedRemote));
    }
    assertEquals(
        SeedReferencePlanner.plan(c.geometry(), c.remoteNumBlocks(), c.local(), c.remote()),
        PLANNER.plan(c.geometry(), c.remoteNumBlocks(), c.local(), c.remote()));
  }

  @Provide
  Arbitrary<PlanCase> cases() {
    Arbitrary<Integer> numBlocks =
        Arbitraries.frequencyOf(
            Tuple.of(6, Arbitraries.integers().between(1, 40)),
            Tuple.of(3, Arbitraries.integers().between(1, 2000)),
            Tuple.of(1, Arbitraries.integers().between(1, 200_000)));
    Arbitrary<KvCacheGeometry> standard =
        Combinators.combine(
                numBlocks,
                Arbitraries.of(1, 16, 32),
                Arbitraries.integers().between(1, 8),
                Arbitraries.of(64, 128, 7),
                Arbitraries.of(1, 2, 4))
            .as(KvCacheGeometry::standard);
    Arbitrary<KvCacheGeometry> mla =
        Combinators.combine(
                numBlocks,
                Arbitraries.of(1, 16, 64),
                Arbitraries.of(576, 512, 3),
                Arbitraries.of(1, 2))
            .as(KvCacheGeometry::mla);
    Arbitrary<Integer> remoteNumBlocks =
        Arbitraries.frequencyOf(
            Tuple.of(9, numBlocks), Tuple.of(1, Arbitraries.integers().between(1, 1 << 29)));
    return Combinators.combine(
            Arbitraries.oneOf(standard, mla),
            remoteNumBlocks,
            Arbitraries.of(Shape.class),
            // Past 2,048 blocks a standard plan can exceed the planner's scratch arrays (4,096
            // copies): such plans count first and write into their own arrays.
            Arbitraries.frequencyOf(
                Tuple.of(7, Arbitraries.integers().between(0, 300)),
                Tuple.of(3, Arbitraries.integers().between(2049, 5000))),
            Arbitraries.longs())
        .as(TransferPlannerPropertiesTest::buildCase);
  }

  private static PlanCase buildCase(
      KvCacheGeometry g, int remoteNumBlocks, Shape shape, int wanted, long seed) {
    Random random = new Random(seed);
    int n = Math.min(wanted, Math.min(g.numBlocks(), remoteNumBlocks));
    int[] local;
    int[] remote;
    switch (shape) {
      case RUNS, SHUFFLED_RUNS -> {
        local = BlockIdSamples.runs(random, n, g.numBlocks(), 4);
        remote = BlockIdSamples.runs(random, n, remoteNumBlocks, 4);
        if (shape == Shape.SHUFFLED_RUNS) {
          BlockIdSamples.shuffleTogether(random, local, remote);
        }
      }
      case SCATTERED, SCATTERED_SORTED -> {
        local = BlockIdSamples.distinct(random, n, g.numBlocks());
        remote = BlockIdSamples.distinct(random, n, remoteNumBlocks);
        if (shape == Shape.SCATTERED_SORTED) {
          sortByLocal(local, remote);
        }
      }
      case EDGES -> {
        int k = Math.min(n, 2);
        local = new int[k];
        remote = new int[k];
        if (k == 2) {
          // Last block on both sides first, then block 0: K of one run meets V of the other.
          local[0] = g.numBlocks() - 1;
          remote[0] = remoteNumBlocks - 1;
        }
        if (k >= 1) {
          local[k - 1] = 0;
          remote[k - 1] = 0;
        }
        if (random.nextBoolean()) {
          BlockIdSamples.shuffleTogether(random, local, remote);
        }
      }
      default -> throw new AssertionError(shape);
    }
    return new PlanCase(g, remoteNumBlocks, local, remote);
  }




  private static void sortByLocal(int[] local, int[] remote) {
    long[] packed = new long[local.length];
    for (int i = 0; i < local.length; i++) {
      packed[i] = ((long) local[i] << 32) | remote[i];
    }
    Arrays.sort(packed);
    for (int i = 0; i < local.length; i++) {
      local[i] = (int) (packed[i] >>> 32);
      remote[i] = (int) packed[i];
    }
  }
}
