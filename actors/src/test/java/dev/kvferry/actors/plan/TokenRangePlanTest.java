package dev.kvferry.actors.plan;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvferry.rdma.TransferBatch;
import org.junit.jupiter.api.Test;

/**
 * The token-range plan, checked by applying it to byte arrays and comparing each token's heads
 * with where an independent index computation says they belong.
 */
class TokenRangePlanTest {

  private final TransferPlanner planner = new TransferPlanner();

  /** Applies the batch local -> remote; returns the remote bytes (unwritten bytes stay 0). */
  private static byte[] apply(TransferBatch b, byte[] local, int remoteBytes) {
    byte[] remote = new byte[remoteBytes];
    for (int i = 0; i < b.count(); i++) {
      System.arraycopy(local, (int) b.localOffsets()[i], remote, (int) b.remoteOffsets()[i],
          (int) b.sizes()[i]);
    }
    return remote;
  }

  /**
   * Byte offset of (region, token, head, byte within the head) in a layer of geometry g, from the
   * tensor's shape alone (row-major index), not from the geometry's stride helpers.
   */
  private static int at(KvCacheGeometry g, int[] ids, int region, int token, int head, int b) {
    int headBytes = g.layout() == KvCacheGeometry.Layout.MLA
        ? g.latent() * g.elementBytes() : g.headDim() * g.elementBytes();
    int heads = g.layout() == KvCacheGeometry.Layout.MLA ? 1 : g.kvHeads();
    int block = ids[token / g.blockSize()];
    int slot = token % g.blockSize();
    // Index of the token's row of heads in the tensor seen as [..., block_size, heads, bytes].
    int row = switch (g.layout()) {
      case STANDARD -> (region * g.numBlocks() + block) * g.blockSize() + slot; // [2, N, bs, ..]
      case BLOCKS_FIRST -> (block * 2 + region) * g.blockSize() + slot; // [N, 2, bs, ..]
      case MLA -> block * g.blockSize() + slot; // [N, bs, latent]
    };
    return (row * heads + head) * headBytes + b;
  }

  private static byte[] numbered(KvCacheGeometry g) {
    byte[] a = new byte[(int) g.layerRegionBytes()];
    for (int i = 0; i < a.length; i++) {
      a[i] = (byte) (i * 31 + 7 + (i >> 8));
    }
    return a;
  }

  /** Checks every moved byte for tokens [0, tokens) and the slice; nothing else is written. */
  private void movesExactlyTheSlice(KvCacheGeometry l, KvCacheGeometry r, HeadSlice s,
      int[] lids, int[] rids, int tokens) throws Exception {
    TransferBatch batch = planner.planTokenRanges(l, r, s, lids, rids);
    byte[] local = numbered(l);
    byte[] remote = apply(batch, local, (int) r.layerRegionBytes());
    boolean mla = l.layout() == KvCacheGeometry.Layout.MLA;
    int headBytes = mla ? l.latent() * l.elementBytes() : l.headDim() * l.elementBytes();
    int heads = mla ? 1 : s.count();
    long moved = 0;
    for (int region = 0; region < (mla ? 1 : 2); region++) {
      for (int t = 0; t < tokens; t++) {
        for (int h = 0; h < heads; h++) {
          for (int b = 0; b < headBytes; b++) {
            int lh = mla ? 0 : s.localFirst() + h;
            int rh = mla ? 0 : s.remoteFirst() + h;
            assertEquals(local[at(l, lids, region, t, lh, b)], remote[at(r, rids, region, t, rh, b)],
                "region " + region + " token " + t + " head " + h + " byte " + b);
            moved++;
          }
        }
      }
    }
    assertEquals(moved, batch.totalBytes(), "bytes beyond the slice were moved");
  }

  @Test
  void sixteenToThirtyTwoTokenBlocksMergesRunsAcrossBlocks() throws Exception {
    KvCacheGeometry p = KvCacheGeometry.standard(12, 16, 4, 8, 2);
    KvCacheGeometry d = KvCacheGeometry.standard(6, 32, 4, 8, 2);
    // P blocks 2,3 fill D block 5; P blocks 7,8 fill D block 1: two runs per region.
    int[] pids = {2, 3, 7, 8};
    int[] dids = {5, 1};
    movesExactlyTheSlice(p, d, HeadSlice.all(4), pids, dids, 64);
    TransferBatch b = planner.planTokenRanges(p, d, HeadSlice.all(4), pids, dids);
    assertEquals(4, b.count());
    assertArrayEquals(new long[] {2 * p.blockBytes(), 7 * p.blockBytes(),
        p.kToVStrideBytes() + 2 * p.blockBytes(), p.kToVStrideBytes() + 7 * p.blockBytes()},
        b.localOffsets());
    assertEquals(2 * p.blockBytes(), b.sizes()[0]);
  }

  @Test
  void thirtyTwoToSixteenTokenBlocksCoversAPartialLastBlock() throws Exception {
    KvCacheGeometry p = KvCacheGeometry.standard(6, 8, 4, 8, 2);
    KvCacheGeometry d = KvCacheGeometry.standard(12, 4, 4, 8, 2);
    // 10 tokens: 2 P blocks (16 slots), 3 D blocks (12 slots): 12 tokens move.
    movesExactlyTheSlice(p, d, HeadSlice.all(4), new int[] {4, 0}, new int[] {9, 3, 2}, 12);
  }

  @Test
  void headSlicesOfDifferentTpSizesLandAtTheirHeadOffset() throws Exception {
    // P rank 1 of 2 holds heads 2,3; D (TP 1) holds 0..3: heads 2,3 at offset 2 on D.
    KvCacheGeometry p = KvCacheGeometry.standard(8, 4, 2, 8, 2);
    KvCacheGeometry d = KvCacheGeometry.standard(8, 8, 4, 8, 2);
    HeadSlice s = TensorParallelSplit.slice(1, 2, 0, 1, 4);
    assertEquals(new HeadSlice(0, 2, 2), s);
    movesExactlyTheSlice(p, d, s, new int[] {1, 2, 5}, new int[] {3, 7}, 12);
  }

  @Test
  void mlaMovesTheWholeLatentPerToken() throws Exception {
    KvCacheGeometry p = KvCacheGeometry.mla(8, 4, 12, 2);
    KvCacheGeometry d = KvCacheGeometry.mla(8, 8, 12, 2);
    movesExactlyTheSlice(p, d, null, new int[] {0, 1, 6, 7}, new int[] {2, 4}, 16);
    assertEquals(2, planner.planTokenRanges(p, d, null, new int[] {0, 1, 6, 7},
        new int[] {2, 4}).count());
  }

  @Test
  void blocksFirstMovesEachBlocksKAndVAcrossBlockSizesAndHeadSlices() throws Exception {
    // [N, 2, bs, heads, dim]: a block's K then its V. P rank 1 of 2 (heads 2,3) into D's TP 1.
    KvCacheGeometry p = KvCacheGeometry.blocksFirst(8, 4, 2, 8, 2);
    KvCacheGeometry d = KvCacheGeometry.blocksFirst(8, 8, 4, 8, 2);
    movesExactlyTheSlice(p, d, TensorParallelSplit.slice(1, 2, 0, 1, 4), new int[] {1, 2, 5},
        new int[] {3, 7}, 12);
    // Same heads, blocks of 4 into blocks of 8: a P block's K is one run on both sides.
    KvCacheGeometry d4 = KvCacheGeometry.blocksFirst(8, 8, 2, 8, 2);
    movesExactlyTheSlice(p, d4, HeadSlice.all(2), new int[] {6, 0}, new int[] {2}, 8);
    assertEquals(4, planner.planTokenRanges(p, d4, HeadSlice.all(2), new int[] {6, 0},
        new int[] {2}).count());
  }

  @Test
  void aStandardCacheExchangesTokensWithABlocksFirstOneBothWays() throws Exception {
    KvCacheGeometry standard = KvCacheGeometry.standard(10, 4, 2, 8, 2);
    KvCacheGeometry blocksFirst = KvCacheGeometry.blocksFirst(6, 4, 2, 8, 2);
    movesExactlyTheSlice(standard, blocksFirst, HeadSlice.all(2), new int[] {9, 3, 4},
        new int[] {0, 5, 1}, 12);
    movesExactlyTheSlice(blocksFirst, standard, HeadSlice.all(2), new int[] {0, 5, 1},
        new int[] {9, 3, 4}, 12);
    // One copy per block and region: a block's K (or V) is contiguous on both sides.
    assertEquals(6, planner.planTokenRanges(standard, blocksFirst, HeadSlice.all(2),
        new int[] {9, 3, 4}, new int[] {0, 5, 1}).count());
    // Head slices too: D's TP 2 rank 0 takes heads 0..1 of P's 4.
    KvCacheGeometry wide = KvCacheGeometry.standard(10, 4, 4, 8, 2);
    movesExactlyTheSlice(wide, blocksFirst, TensorParallelSplit.slice(0, 1, 0, 2, 4),
        new int[] {2, 7}, new int[] {4, 3}, 8);
  }

  @Test
  void refusesToExchangeTokensBetweenHeadsAndALatent() {
    KvCacheGeometry blocksFirst = KvCacheGeometry.blocksFirst(6, 4, 2, 8, 2);
    KvCacheGeometry mla = KvCacheGeometry.mla(6, 4, 32, 2);
    assertThrows(IllegalArgumentException.class,
        () -> planner.planTokenRanges(blocksFirst, mla, HeadSlice.all(2), new int[] {0},
            new int[] {0}));
  }

  @Test
  void refusesListsThatCoverDifferentBlocksOfTheRequest() {
    KvCacheGeometry p = KvCacheGeometry.standard(12, 16, 4, 8, 2);
    KvCacheGeometry d = KvCacheGeometry.standard(6, 32, 4, 8, 2);
    String msg = assertThrows(InvalidBlockIdsException.class,
        () -> planner.planTokenRanges(p, d, HeadSlice.all(4), new int[] {1, 2, 3, 4},
            new int[] {0})).getMessage();
    assertTrue(msg.contains("4 local blocks of 16 tokens and 1 remote blocks of 32"), msg);
  }

  @Test
  void refusesOutOfRangeAndRepeatedIdsLikeTheBlockPlan() {
    KvCacheGeometry p = KvCacheGeometry.standard(12, 16, 4, 8, 2);
    KvCacheGeometry d = KvCacheGeometry.standard(6, 32, 4, 8, 2);
    assertEquals("remote block id 6 at position 0 is out of range: the remote engine has 6 blocks"
        + " (ids 0 to 5)", assertThrows(InvalidBlockIdsException.class,
            () -> planner.planTokenRanges(p, d, HeadSlice.all(4), new int[] {1, 2},
                new int[] {6})).getMessage());
    assertEquals("local block id 1 at position 1 repeats position 0; each block may appear once"
        + " per request", assertThrows(InvalidBlockIdsException.class,
            () -> planner.planTokenRanges(p, d, HeadSlice.all(4), new int[] {1, 1},
                new int[] {0})).getMessage());
  }

  @Test
  void ranksPairByOverlappingHeads() {
    assertArrayEquals(new int[] {0, 1}, TensorParallelSplit.sourcesOf(0, 1, 2, false));
    assertArrayEquals(new int[] {0}, TensorParallelSplit.sourcesOf(1, 2, 1, false));
    assertArrayEquals(new int[] {2, 3}, TensorParallelSplit.sourcesOf(1, 2, 4, false));
    assertArrayEquals(new int[] {1}, TensorParallelSplit.targetsOf(3, 4, 2, false));
    assertArrayEquals(new int[] {1}, TensorParallelSplit.targetsOf(1, 2, 2, false));
    // MLA: one source per D rank; P ranks beyond D's size send nothing.
    assertArrayEquals(new int[] {1}, TensorParallelSplit.sourcesOf(1, 2, 4, true));
    assertArrayEquals(new int[] {}, TensorParallelSplit.targetsOf(3, 4, 2, true));
    assertArrayEquals(new int[] {0, 1}, TensorParallelSplit.targetsOf(0, 1, 2, true));
    assertEquals(new HeadSlice(6, 0, 2), TensorParallelSplit.slice(0, 1, 3, 4, 8));
  }
}
