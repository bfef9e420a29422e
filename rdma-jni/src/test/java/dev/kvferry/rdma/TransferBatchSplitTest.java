package dev.kvferry.rdma;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.Random;
import java.util.stream.LongStream;
import org.junit.jupiter.api.Test;

/** Cutting a batch into parts for striping: whole entries, in order, near-equal bytes. */
class TransferBatchSplitTest {

  private static TransferBatch batch(long... sizes) {
    long[] lo = new long[sizes.length];
    long[] ro = new long[sizes.length];
    long at = 0;
    for (int i = 0; i < sizes.length; i++) {
      lo[i] = at;
      ro[i] = 1_000_000 + at;
      at += sizes[i];
    }
    return new TransferBatch(lo, ro, sizes);
  }

  private static void assertPartsCover(TransferBatch whole, TransferBatch[] parts) {
    int i = 0;
    for (TransferBatch p : parts) {
      assertTrue(p.count() > 0, "an empty part");
      for (int j = 0; j < p.count(); j++, i++) {
        assertEquals(whole.localOffsets()[i], p.localOffsets()[j]);
        assertEquals(whole.remoteOffsets()[i], p.remoteOffsets()[j]);
        assertEquals(whole.sizes()[i], p.sizes()[j]);
      }
    }
    assertEquals(whole.count(), i, "entries lost or repeated");
  }

  @Test
  void equalEntriesSplitIntoEqualParts() {
    TransferBatch b = batch(LongStream.generate(() -> 4096).limit(12).toArray());
    TransferBatch[] parts = b.split(3);
    assertEquals(3, parts.length);
    for (TransferBatch p : parts) {
      assertEquals(4, p.count());
    }
    assertPartsCover(b, parts);
  }

  @Test
  void oneOrNoPartAndSingleEntriesAreTheBatchItself() {
    TransferBatch b = batch(10, 20, 30);
    assertSame(b, b.split(1)[0]);
    TransferBatch one = batch(1 << 20);
    assertSame(one, one.split(4)[0]);
    assertEquals(0, TransferBatch.EMPTY.split(4)[0].count());
  }

  @Test
  void moreWantedPartsThanEntriesGiveOneEntryEach() {
    TransferBatch b = batch(5, 6, 7);
    TransferBatch[] parts = b.split(8);
    assertEquals(3, parts.length);
    assertPartsCover(b, parts);
  }

  @Test
  void aHugeEntryLastStillLeavesEveryPartAnEntry() {
    TransferBatch b = batch(1, 1, 1, 1_000_000);
    TransferBatch[] parts = b.split(3);
    assertEquals(3, parts.length);
    assertPartsCover(b, parts);
    assertEquals(1_000_000, parts[2].sizes()[parts[2].count() - 1]);
  }

  @Test
  void randomBatchesAreCoveredInOrderAndNoPartTakesMuchMoreThanItsShare() {
    Random rnd = new Random(42);
    for (int round = 0; round < 200; round++) {
      int n = 1 + rnd.nextInt(300);
      long[] sizes = new long[n];
      for (int i = 0; i < n; i++) {
        sizes[i] = 1 + rnd.nextInt(64 << 10);
      }
      TransferBatch b = batch(sizes);
      int want = 1 + rnd.nextInt(6);
      TransferBatch[] parts = b.split(want);
      assertEquals(Math.min(want, n), parts.length);
      assertPartsCover(b, parts);
      long largest = LongStream.of(sizes).max().orElse(0);
      for (TransferBatch p : parts) {
        assertTrue(p.totalBytes() <= b.totalBytes() / parts.length + 2 * largest,
            "a part of " + p.totalBytes() + " of " + b.totalBytes() + " in " + parts.length);
      }
    }
  }
}
