package dev.kvferry.actors;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.ByteOrder;
import java.nio.MappedByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

/**
 * D's done-word watcher, with this test storing the words as P's copy stream would (a second
 * mapping of the same /dev/shm file, written by the CPU instead of a GPU).
 */
class DoneWordWatcherTest {
  private final LinkedBlockingQueue<String> seen = new LinkedBlockingQueue<>();
  private DoneWordWatcher watcher;

  @BeforeEach
  void open() {
    watcher = DoneWordWatcher.tryCreate("test", seen::add);
    assertNotNull(watcher, "/dev/shm is writable here");
  }

  @AfterEach
  void close() {
    watcher.close();
  }

  @Test
  void reportsATransferOnceItsWordHoldsItsValueAndNotBefore() throws Exception {
    DoneWordWatcher.Ticket a = watcher.register("tx-a");
    DoneWordWatcher.Ticket b = watcher.register("tx-b");
    assertTrue(b.value() > a.value());
    store(b, b.value() - 1); // an older value in b's word: not b's store
    assertEquals(null, seen.poll(200, TimeUnit.MILLISECONDS));
    store(b, b.value());
    assertEquals("tx-b", seen.poll(10, TimeUnit.SECONDS));
    store(a, a.value());
    assertEquals("tx-a", seen.poll(10, TimeUnit.SECONDS));
    assertEquals(null, seen.poll(200, TimeUnit.MILLISECONDS), "each transfer reported once");
  }

  @Test
  void aForgottenTransferIsNotReported() throws Exception {
    DoneWordWatcher.Ticket t = watcher.register("tx-gone");
    watcher.forget("tx-gone");
    store(t, t.value());
    assertEquals(null, seen.poll(300, TimeUnit.MILLISECONDS));
  }

  @Test
  void aSlotReusedWhileItsTransferIsPendingFallsBackToMessages() throws Exception {
    DoneWordWatcher.Ticket first = watcher.register("tx-old");
    DoneWordWatcher.Ticket reuse = null;
    for (int i = 0; i < DoneWordWatcher.SLOTS; i++) {
      DoneWordWatcher.Ticket t = watcher.register("tx-" + i);
      watcher.forget("tx-" + i);
      if (t.slot() == first.slot()) {
        reuse = t;
      }
    }
    assertNotNull(reuse);
    assertTrue(reuse.value() > first.value());
    // The newer transfer's value in the shared slot must not complete the old one.
    store(reuse, reuse.value());
    assertEquals(null, seen.poll(300, TimeUnit.MILLISECONDS));
    assertFalse(seen.contains("tx-old"));
  }

  private static void store(DoneWordWatcher.Ticket t, long value) throws Exception {
    try (FileChannel ch = FileChannel.open(
        dev.kvferry.rdma.cuda.SharedDoneWords.PEER_DIR.resolve(t.name()), StandardOpenOption.READ,
        StandardOpenOption.WRITE)) {
      MappedByteBuffer b = ch.map(FileChannel.MapMode.READ_WRITE, 0, 8L * t.slots());
      b.order(ByteOrder.nativeOrder()).putLong(8 * t.slot(), value);
      b.force();
    }
    assertTrue(Files.exists(dev.kvferry.rdma.cuda.SharedDoneWords.PEER_DIR.resolve(t.name())));
  }

  @Test
  void doneWordFilesOfProcessesThatAreGoneAreSweptAndThoseOfLiveOnesKept(@org.junit.jupiter.api.io.TempDir Path dir)
      throws Exception {
    long ownPid = ProcessHandle.current().pid();
    long deadPid = 4_000_000_000L; // above any Linux pid_max: no such process
    Path dead = Files.write(dir.resolve("kvferry-done-decode-0_tp0-" + deadPid + "-ab12"), new byte[8]);
    Path live = Files.write(dir.resolve("kvferry-done-decode-0_tp0-" + ownPid + "-cd34"), new byte[8]);
    Path other = Files.write(dir.resolve("someone-else-" + deadPid + "-ab12"), new byte[8]);
    assertEquals(1, DoneWordWatcher.sweepStale(dir));
    assertFalse(Files.exists(dead), "a killed decode's file stays in /dev/shm");
    assertTrue(Files.exists(live));
    assertTrue(Files.exists(other));
  }
}
