package dev.kvferry.actors.plan;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertThrows;

import dev.kvferry.rdma.TransferBatch;
import org.junit.jupiter.api.Test;

class TransferPlannerTest {

  private static final long BLOCK = 16L * 8 * 128 * 2; // 16 tokens, 8 heads, 128 dims, bf16
  private static final KvCacheGeometry TEN_BLOCKS = KvCacheGeometry.standard(10, 16, 8, 128, 2);

  private final TransferPlanner planner = new TransferPlanner();

  private String rejection(int remoteNumBlocks, int[] local, int[] remote) {
    return assertThrows(
            InvalidBlockIdsException.class,
            () -> planner.plan(TEN_BLOCKS, remoteNumBlocks, local, remote))
        .getMessage();
  }

  @Test
  void mergesARunIntoOneCopyForKAndOneForVUsingTheRemoteKToVStride() throws Exception {
    TransferBatch batch = planner.plan(TEN_BLOCKS, 20, new int[] {2, 3, 4}, new int[] {7, 8, 9});

    assertArrayEquals(new long[] {2 * BLOCK, (10 + 2) * BLOCK}, batch.localOffsets());
    assertArrayEquals(new long[] {7 * BLOCK, (20 + 7) * BLOCK}, batch.remoteOffsets());
    assertArrayEquals(new long[] {3 * BLOCK, 3 * BLOCK}, batch.sizes());
  }

  @Test
  void ordersCopiesByLocalOffsetAndSplitsWhereOnlyOneSideIsContiguous() throws Exception {
    TransferBatch batch = planner.plan(TEN_BLOCKS, 10, new int[] {5, 1, 2}, new int[] {0, 4, 6});

    assertArrayEquals(
        new long[] {1 * BLOCK, 2 * BLOCK, 5 * BLOCK, 11 * BLOCK, 12 * BLOCK, 15 * BLOCK},
        batch.localOffsets());
    assertArrayEquals(
        new long[] {4 * BLOCK, 6 * BLOCK, 0, 14 * BLOCK, 16 * BLOCK, 10 * BLOCK},
        batch.remoteOffsets());
  }

  @Test
  void mergesTheLastKBlockWithTheFirstVBlockWhenBothSidesMeetAsTheSeedDoes() throws Exception {
    KvCacheGeometry fourBlocks = KvCacheGeometry.standard(4, 1, 1, 1, 1);

    TransferBatch batch = planner.plan(fourBlocks, 4, new int[] {3, 0}, new int[] {3, 0});

    assertArrayEquals(new long[] {0, 3, 7}, batch.localOffsets());
    assertArrayEquals(new long[] {0, 3, 7}, batch.remoteOffsets());
    assertArrayEquals(new long[] {1, 2, 1}, batch.sizes());
  }

  @Test
  void plansOneCopyPerRunForMla() throws Exception {
    KvCacheGeometry mla = KvCacheGeometry.mla(100, 64, 576, 2);
    long block = 64L * 576 * 2;

    TransferBatch batch = planner.plan(mla, 7, new int[] {11, 10, 40}, new int[] {1, 0, 2});

    assertArrayEquals(new long[] {10 * block, 40 * block}, batch.localOffsets());
    assertArrayEquals(new long[] {0, 2 * block}, batch.remoteOffsets());
    assertArrayEquals(new long[] {2 * block, block}, batch.sizes());
  }

  @Test
  void plansOneCopyPerRunOfWholeBlocksForBlocksFirst() throws Exception {
    // [100, 2, 16, 2, 64] bf16: a block's K and V are one 8 KiB run, so a run of blocks is one copy.
    KvCacheGeometry blocksFirst = KvCacheGeometry.blocksFirst(100, 16, 2, 64, 2);
    long block = 2L * 16 * 2 * 64 * 2;

    TransferBatch batch = planner.plan(blocksFirst, 7, new int[] {11, 10, 40}, new int[] {1, 0, 2});

    assertArrayEquals(new long[] {10 * block, 40 * block}, batch.localOffsets());
    assertArrayEquals(new long[] {0, 2 * block}, batch.remoteOffsets());
    assertArrayEquals(new long[] {2 * block, block}, batch.sizes());
  }

  @Test
  void returnsAnEmptyBatchForNoBlocks() throws Exception {
    assertSame(TransferBatch.EMPTY, planner.plan(TEN_BLOCKS, 10, new int[0], new int[0]));
  }

  @Test
  void rejectsListsOfDifferentLengthNamingTheFirstUnmatchedId() {
    assertEquals(
        "local block id 9 at position 2 has no remote block: 3 local block ids but 2 remote block"
            + " ids; each local block needs exactly one remote block",
        rejection(10, new int[] {1, 2, 9}, new int[] {1, 2}));
    assertEquals(
        "remote block id 4 at position 1 has no local block: 1 local block ids but 2 remote block"
            + " ids; each local block needs exactly one remote block",
        rejection(10, new int[] {1}, new int[] {3, 4}));
  }

  @Test
  void rejectsANegativeLocalId() {
    assertEquals(
        "local block id -1 at position 1 is negative; block ids start at 0",
        rejection(10, new int[] {0, -1}, new int[] {0, 1}));
  }

  @Test
  void rejectsANegativeRemoteId() {
    assertEquals(
        "remote block id -5 at position 0 is negative; block ids start at 0",
        rejection(10, new int[] {0, 1}, new int[] {-5, 1}));
  }

  @Test
  void rejectsALocalIdBeyondThisEnginesBlocks() {
    assertEquals(
        "local block id 10 at position 2 is out of range: this engine has 10 blocks (ids 0 to 9)",
        rejection(50, new int[] {0, 1, 10}, new int[] {0, 1, 2}));
  }

  @Test
  void rejectsARemoteIdBeyondTheRemoteEnginesBlocksEvenIfItFitsLocally() {
    assertEquals(
        "remote block id 6 at position 1 is out of range: the remote engine has 6 blocks (ids 0 to"
            + " 5)",
        rejection(6, new int[] {0, 1}, new int[] {0, 6}));
  }

  @Test
  void rejectsARepeatedLocalIdNamingBothPositions() {
    assertEquals(
        "local block id 4 at position 2 repeats position 0; each block may appear once per request",
        rejection(10, new int[] {4, 5, 4}, new int[] {0, 1, 2}));
  }

  @Test
  void rejectsARepeatedLocalIdInASparseRequestOfALargeCache() {
    KvCacheGeometry large = KvCacheGeometry.standard(1_000_000, 16, 1, 1, 1);
    InvalidBlockIdsException e =
        assertThrows(
            InvalidBlockIdsException.class,
            () -> planner.plan(large, 10, new int[] {999_999, 5, 999_999}, new int[] {0, 1, 2}));
    assertEquals(
        "local block id 999999 at position 2 repeats position 0; each block may appear once per"
            + " request",
        e.getMessage());
  }

  @Test
  void checksRemoteIdsOfAPeerClaimingAHugeCache() throws Exception {
    int huge = Integer.MAX_VALUE;
    assertEquals(
        "remote block id 2000000000 at position 2 repeats position 0; each block may appear once"
            + " per request",
        rejection(huge, new int[] {0, 1, 2}, new int[] {2_000_000_000, 0, 2_000_000_000}));

    TransferBatch batch =
        planner.plan(TEN_BLOCKS, huge, new int[] {0, 1}, new int[] {5, 2_000_000_000});

    long far = 2_000_000_000L;
    assertArrayEquals(
        new long[] {5 * BLOCK, far * BLOCK, (huge + 5L) * BLOCK, (huge + far) * BLOCK},
        batch.remoteOffsets());
  }

  @Test
  void rejectsARepeatedRemoteIdNamingBothPositions() {
    assertEquals(
        "remote block id 3 at position 1 repeats position 0; each block may appear once per"
            + " request",
        rejection(10, new int[] {0, 1}, new int[] {3, 3}));
  }

  @Test
  void reportsTheEarliestPositionWhenSeveralIdsAreWrong() {
    assertEquals(
        "remote block id 12 at position 1 is out of range: the remote engine has 12 blocks (ids 0"
            + " to 11)",
        rejection(12, new int[] {5, 6, 5, 99}, new int[] {0, 12, 1, 2}));
  }

  @Test
  void plansCorrectlyAfterARejection() throws Exception {
    rejection(10, new int[] {3, 1, 3}, new int[] {0, 1, 2});
    rejection(10, new int[] {3, 1, 2}, new int[] {0, 1, 0});

    TransferBatch batch = planner.plan(TEN_BLOCKS, 10, new int[] {3, 1, 2}, new int[] {2, 0, 1});

    assertArrayEquals(new long[] {1 * BLOCK, 11 * BLOCK}, batch.localOffsets());
    assertArrayEquals(new long[] {0, 10 * BLOCK}, batch.remoteOffsets());
    assertArrayEquals(new long[] {3 * BLOCK, 3 * BLOCK}, batch.sizes());
  }

  @Test
  void aRemoteIdOfAnEarlierRequestIsNoRepeatInTheNextButOneWithinItIs() throws Exception {
    // The remote repeat check marks ids per call and clears nothing between calls.
    planner.plan(TEN_BLOCKS, 10, new int[] {0, 1}, new int[] {5, 6});
    TransferBatch batch = planner.plan(TEN_BLOCKS, 10, new int[] {0, 1}, new int[] {6, 7});
    assertArrayEquals(new long[] {6 * BLOCK, 16 * BLOCK}, batch.remoteOffsets());

    assertEquals(
        "remote block id 7 at position 1 repeats position 0; each block may appear once per"
            + " request",
        rejection(10, new int[] {0, 1}, new int[] {7, 7}));
    // After the rejection the same ids, now distinct, plan again.
    planner.plan(TEN_BLOCKS, 10, new int[] {0, 1}, new int[] {7, 8});
  }

  @Test
  void checksRemoteIdsSpreadWiderThanTheStampTableThroughTheBitmap() throws Exception {
    // 100,001 ids from the lowest to the highest: past the stamps' span, within the bitmap's.
    assertEquals(
        "remote block id 100000 at position 2 repeats position 1; each block may appear once per"
            + " request",
        rejection(200_000, new int[] {0, 1, 2}, new int[] {0, 100_000, 100_000}));
    TransferBatch batch =
        planner.plan(TEN_BLOCKS, 200_000, new int[] {0, 1, 2}, new int[] {0, 100_000, 1});
    assertArrayEquals(new long[] {0, 100_000 * BLOCK, BLOCK, 200_000 * BLOCK,
        300_000 * BLOCK, 200_001 * BLOCK}, batch.remoteOffsets());
  }

  @Test
  void refusesARemoteEngineWithoutBlocks() {
    IllegalArgumentException e =
        assertThrows(
            IllegalArgumentException.class,
            () -> planner.plan(TEN_BLOCKS, 0, new int[] {0}, new int[] {0}));
    assertEquals("remote engine must have at least 1 block, got 0", e.getMessage());
  }
}
