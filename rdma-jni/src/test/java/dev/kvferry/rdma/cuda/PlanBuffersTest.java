package dev.kvferry.rdma.cuda;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotSame;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.HashSet;
import java.util.Set;
import org.junit.jupiter.api.Test;

/**
 * The pooling of plan buffers, on an allocator that hands out numbered pairs and records which are
 * live, so a pair freed twice, or used after it was freed, or never freed shows. The CUDA allocator
 * itself runs in the GPU tests ({@code CudaTransportTest}).
 */
class PlanBuffersTest {

  /** Hands out distinct fake addresses; remembers which pairs are allocated and not freed. */
  private static final class Ledger implements PlanBuffers.Allocator {
    final Set<PlanBuffers.Pair> live = new HashSet<>();
    long next = 0x1000;
    int allocated;
    int freed;

    @Override
    public PlanBuffers.Pair allocate(long bytes) {
      PlanBuffers.Pair p = new PlanBuffers.Pair(next, next + (1L << 40), bytes);
      next += bytes;
      live.add(p);
      allocated++;
      return p;
    }

    @Override
    public void free(PlanBuffers.Pair pair) {
      assertTrue(live.remove(pair), "freed a pair that is not live: " + pair);
      freed++;
    }
  }

  @Test
  void sizesRoundUpToAPowerOfTwoOfAtLeastTheMinimum() {
    assertEquals(PlanBuffers.MIN_BYTES, PlanBuffers.sizeClass(1));
    assertEquals(PlanBuffers.MIN_BYTES, PlanBuffers.sizeClass(PlanBuffers.MIN_BYTES));
    assertEquals(2 * PlanBuffers.MIN_BYTES, PlanBuffers.sizeClass(PlanBuffers.MIN_BYTES + 1));
    assertEquals(1L << 20, PlanBuffers.sizeClass((1L << 20) - 8));
    assertEquals(1L << 21, PlanBuffers.sizeClass((1L << 20) + 8));
  }

  @Test
  void aPairGivenBackServesTheNextPlanOfItsClassWithoutAllocating() {
    Ledger ledger = new Ledger();
    PlanBuffers buffers = new PlanBuffers(ledger, 1L << 20);
    PlanBuffers.Pair first = buffers.take(100);
    assertEquals(PlanBuffers.MIN_BYTES, first.bytes());
    buffers.give(first);
    assertEquals(PlanBuffers.MIN_BYTES, buffers.pooledBytes());
    assertSame(first, buffers.take(5_000), "same class: the pooled pair");
    assertEquals(1, ledger.allocated);
    PlanBuffers.Pair bigger = buffers.take(PlanBuffers.MIN_BYTES * 3);
    assertNotSame(first, bigger);
    assertEquals(4 * PlanBuffers.MIN_BYTES, bigger.bytes(), "another class: a new pair");
    assertEquals(2, buffers.allocations());
    buffers.give(first);
    buffers.give(bigger);
    buffers.close();
    assertEquals(0, ledger.live.size(), "close frees every pair held");
  }

  @Test
  void pairsBeyondTheBoundAreFreedAtOnce() {
    Ledger ledger = new Ledger();
    PlanBuffers buffers = new PlanBuffers(ledger, 2 * PlanBuffers.MIN_BYTES);
    PlanBuffers.Pair a = buffers.take(1);
    PlanBuffers.Pair b = buffers.take(1);
    PlanBuffers.Pair c = buffers.take(1);
    buffers.give(a);
    buffers.give(b);
    buffers.give(c);
    assertEquals(2 * PlanBuffers.MIN_BYTES, buffers.pooledBytes());
    assertEquals(1, ledger.freed, "the third pair did not fit the bound");
    PlanBuffers.Pair huge = buffers.take(4 * PlanBuffers.MIN_BYTES);
    buffers.give(huge);
    assertEquals(2, ledger.freed, "a pair larger than the bound is never kept");
    buffers.close();
    assertEquals(0, ledger.live.size());
  }

  @Test
  void afterCloseGivenPairsAreFreedAndTakesFail() {
    Ledger ledger = new Ledger();
    PlanBuffers buffers = new PlanBuffers(ledger, 1L << 20);
    PlanBuffers.Pair inUse = buffers.take(1); // a plan still queued when the transport closes
    buffers.close();
    buffers.give(inUse);
    assertEquals(0, ledger.live.size(), "a pair given back after close is freed, not kept");
    IllegalStateException e = assertThrows(IllegalStateException.class, () -> buffers.take(1));
    assertTrue(e.getMessage().contains("closed"), e.getMessage());
  }
}
