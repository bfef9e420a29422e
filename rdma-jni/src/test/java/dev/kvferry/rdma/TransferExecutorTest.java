package dev.kvferry.rdma;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.Test;

class TransferExecutorTest {

  @Test
  void closingFailsTheQueuedTransfersAndReleasesEach() throws Exception {
    TransferExecutor ex = new TransferExecutor("test", 1);
    CountDownLatch running = new CountDownLatch(1);
    CountDownLatch never = new CountDownLatch(1);
    CountDownLatch released = new CountDownLatch(3);
    TransferStatus first = TransferStatus.pending();
    ex.submit(first, () -> {
      running.countDown();
      try {
        never.await(); // until close() interrupts it
        first.succeed(0);
      } catch (InterruptedException e) {
        first.fail("interrupted");
      }
    }, released::countDown);
    assertTrue(running.await(10, TimeUnit.SECONDS));
    TransferStatus queued = TransferStatus.pending();
    ex.submit(queued, () -> queued.succeed(1), released::countDown);

    ex.close();

    assertEquals(TransferStatus.State.FAILED, queued.state());
    assertEquals("test transport closed before the transfer started", queued.failureMessage());
    first.completion().get(10, TimeUnit.SECONDS);
    assertEquals("interrupted", first.failureMessage());
    TransferStatus late = TransferStatus.pending();
    ex.submit(late, () -> late.succeed(1), released::countDown);
    assertEquals("test transport is closed", late.failureMessage());
    assertTrue(released.await(10, TimeUnit.SECONDS),
        "released " + (3 - released.getCount()) + " of 3");
  }

  @Test
  void aTransferThatThrowsStillEndsFailedAndReleased() throws Exception {
    TransferExecutor ex = new TransferExecutor("test", 1);
    try {
      CountDownLatch released = new CountDownLatch(1);
      TransferStatus s = TransferStatus.pending();
      ex.submit(s, () -> {
        throw new IllegalStateException("bug");
      }, released::countDown);
      assertTrue(released.await(10, TimeUnit.SECONDS));
      assertEquals("test transfer failed unexpectedly: java.lang.IllegalStateException: bug", s.failureMessage());
      // The thread survives: the next transfer runs.
      TransferStatus next = TransferStatus.pending();
      ex.submit(next, () -> next.succeed(7), () -> {});
      assertEquals(7, next.completion().get(10, TimeUnit.SECONDS).bytesMoved());
    } finally {
      ex.close();
    }
  }
}
