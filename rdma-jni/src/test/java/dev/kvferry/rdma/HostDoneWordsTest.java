package dev.kvferry.rdma;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvferry.rdma.cuda.SharedDoneWords;
import java.io.DataInputStream;
import java.io.IOException;
import java.net.Socket;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.List;
import java.util.concurrent.ThreadLocalRandom;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

/**
 * The done word over the host transports, with D's real words in /dev/shm: cma stores it into
 * its own mapping of D's file, tcp sends it behind the data and D's listener stores it. Either
 * way it lands once the transfer's writes have, never before, never after a failed write, and
 * never into a file that is not D's.
 */
class HostDoneWordsTest {
  private static final int SLOTS = 16;
  private static final int LENGTH = 4 << 20; // above cma's inline limit: copied in the background
  private static final long TIMEOUT_NS = TimeUnit.SECONDS.toNanos(30);

  private RegionRegistry ours;
  private RegionRegistry peer;
  private SharedDoneWords words;
  private MemoryRegion src;
  private MemoryRegion dst;
  private final TransferBatch whole =
      new TransferBatch(new long[] {0}, new long[] {0}, new long[] {LENGTH});

  @BeforeEach
  void open() {
    ours = new RegionRegistry("P0");
    peer = new RegionRegistry("D0");
    words = SharedDoneWords.create(SharedDoneWords.PEER_DIR, "kvferry-done-test-"
        + ProcessHandle.current().pid() + "-"
        + Long.toHexString(ThreadLocalRandom.current().nextLong()), SLOTS);
    src = ours.allocateHost(LENGTH);
    dst = peer.allocateHost(LENGTH);
    Patterns.fill(src, 0, LENGTH, 31);
  }

  @AfterEach
  void close() {
    words.close();
    ours.close();
    peer.close();
  }

  @Test
  void cmaStoresTheWordOnceTheWritesLandedWithTheBytesInPlace() {
    try (CmaTransport cma = new CmaTransport(
        TransportOptions.defaults().withCmaInlineMaxBytes(64 * 1024))) {
      assertTrue(cma.storesDoneWords());
      PeerDoneWords theirs = cma.openPeerDoneWords(words.name(), SLOTS);
      TransferStatus written = cma.write(src, dst.descriptor(), whole);
      TransferStatus stored =
          theirs.storeAfter(List.of(written), src, dst.descriptor(), 3, 42);
      assertTrue(words.awaitAtLeast(3, 42, TIMEOUT_NS) > 0, "the word never landed");
      assertTrue(written.succeeded(), written::toString);
      assertEquals(Patterns.crc(src, 0, LENGTH), Patterns.crc(dst, 0, LENGTH));
      assertTrue(Patterns.await(stored).succeeded(), stored::toString);
      assertEquals(0, words.get(2), "no other word was touched");
      theirs.close();
    }
  }

  /**
   * A thread of D asleep on the bell (as the watcher sleeps, with a timeout far beyond the join
   * below) wakes when P's store rings it, over cma and over tcp; a failed write rings nothing.
   */
  @Test
  void aStoredWordRingsTheBellAndWakesTheSleeperOverCmaAndTcp() throws Exception {
    assertTrue(Futex.available(), "Linux on x86-64 or aarch64 has futexes");
    try (CmaTransport cma = new CmaTransport();
        TcpTransport d = new TcpTransport(peer, TransportOptions.defaults());
        TcpTransport tcp =
            new TcpTransport(ours, TransportOptions.defaults().withTcpListener(false))) {
      d.acceptDoneWords(words);
      int slot = 0;
      for (Transport p : List.<Transport>of(cma, tcp)) {
        assertTrue(p.ringsDoneWordBell(), p.name());
        RegionDescriptor remote = p == cma ? dst.descriptor() : d.describe(dst);
        PeerDoneWords theirs = p.openPeerDoneWords(words.name(), SLOTS);
        int before = words.bell();
        TransferStatus failed = TransferStatus.failed("a write that failed");
        Patterns.await(theirs.storeAfter(List.of(failed), src, remote, ++slot, 5));
        assertEquals(before, words.bell(), p.name() + ": no word, no ring");

        java.util.concurrent.atomic.AtomicLong wokeAt = new java.util.concurrent.atomic.AtomicLong();
        Thread sleeper = new Thread(() -> {
          words.awaitBell(before, TimeUnit.SECONDS.toNanos(120));
          wokeAt.set(System.nanoTime());
        });
        sleeper.start();
        TransferStatus written = p.write(src, remote, whole);
        TransferStatus stored = theirs.storeAfter(List.of(written), src, remote, slot, 11);
        assertTrue(Patterns.await(stored).succeeded(), stored::toString);
        assertEquals(11, words.get(slot));
        assertTrue(words.bell() > before, p.name() + " stored the word and rang nothing");
        sleeper.join(TimeUnit.SECONDS.toMillis(60));
        assertFalse(sleeper.isAlive(), p.name() + ": the ring did not wake the sleeping thread");
        assertTrue(wokeAt.get() > 0);
        theirs.close();
      }
    }
  }

  @Test
  void cmaStoresNothingWhileAWriteIsPendingAndNothingWhenOneFailed() {
    try (CmaTransport cma = new CmaTransport()) {
      PeerDoneWords theirs = cma.openPeerDoneWords(words.name(), SLOTS);
      TransferStatus early = TransferStatus.succeeded(LENGTH);
      TransferStatus last = TransferStatus.pending(); // the last layer, still copying
      TransferStatus stored = theirs.storeAfter(List.of(early, last), src, dst.descriptor(), 1, 7);
      assertEquals(0, words.get(1), "stored before the last write returned");
      assertFalse(stored.isDone());
      last.succeed(LENGTH);
      assertEquals(7, words.get(1));
      assertTrue(stored.succeeded(), stored::toString);

      TransferStatus failed = TransferStatus.failed("cma: peer process 1 of D0 is gone");
      TransferStatus notStored =
          theirs.storeAfter(List.of(failed), src, dst.descriptor(), 2, 9);
      assertEquals(0, words.get(2), "a word after a failed write would complete a broken transfer");
      assertTrue(notStored.failureMessage().contains("peer process 1 of D0 is gone"),
          notStored::toString);
      theirs.close();
    }
  }

  @Test
  void cmaRefusesAFileThatIsNotAKvferryDoneWordFile() throws IOException {
    try (CmaTransport cma = new CmaTransport()) {
      for (String bad : List.of("../etc/passwd", "/dev/shm/" + words.name(), "passwd",
          "kvferry-done-../../x", "kvferry-done-nobody-has-this-" + System.nanoTime())) {
        assertThrows(IllegalArgumentException.class, () -> cma.openPeerDoneWords(bad, SLOTS), bad);
      }
      Path link = SharedDoneWords.PEER_DIR.resolve("kvferry-done-link-"
          + ProcessHandle.current().pid() + "-" + Long.toHexString(System.nanoTime()));
      Files.createSymbolicLink(link, words.path());
      try {
        IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
            () -> cma.openPeerDoneWords(link.getFileName().toString(), SLOTS));
        assertTrue(e.getMessage().contains("not a regular file"), e.getMessage());
      } finally {
        Files.deleteIfExists(link);
      }
      assertThrows(IllegalArgumentException.class,
          () -> cma.openPeerDoneWords(words.name(), SLOTS * 1024), "a size that is not the file's");
    }
  }

  @Test
  void tcpStoresTheWordInBandBehindTheDataIntoDsOwnWords() throws IOException {
    try (TcpTransport d = new TcpTransport(peer, TransportOptions.defaults());
        TcpTransport p =
            new TcpTransport(ours, TransportOptions.defaults().withTcpListener(false))) {
      d.acceptDoneWords(words);
      RegionDescriptor remote = d.describe(dst);
      assertTrue(p.storesDoneWords());
      PeerDoneWords theirs = p.openPeerDoneWords(words.name(), SLOTS);
      TransferStatus written = p.write(src, remote, whole);
      TransferStatus stored = theirs.storeAfter(List.of(written), src, remote, 5, 1234);
      assertTrue(words.awaitAtLeast(5, 1234, TIMEOUT_NS) > 0, "the word never landed");
      assertEquals(Patterns.crc(src, 0, LENGTH), Patterns.crc(dst, 0, LENGTH));
      assertTrue(Patterns.await(stored).succeeded(), stored::toString);

      // Pending writes hold the word back; a failed one drops it.
      TransferStatus last = TransferStatus.pending();
      TransferStatus held = theirs.storeAfter(List.of(last), src, remote, 6, 5);
      assertFalse(held.isDone());
      assertEquals(0, words.get(6));
      last.fail("tcp write to D0 failed: connection reset");
      assertTrue(Patterns.await(held).failureMessage().contains("connection reset"),
          held::toString);
      assertEquals(0, words.get(6));
    }
  }

  @Test
  void tcpListenerStoresAWordOnlyAfterEveryEarlierByteOfItsConnectionLanded() throws Exception {
    try (TcpTransport d = new TcpTransport(peer, TransportOptions.defaults())) {
      d.acceptDoneWords(words);
      RegionDescriptor remote = d.describe(dst);
      int length = 1 << 20;
      // A data frame and the word's frame in one burst, no ack awaited in between (as a pipelining
      // writer could send them): the listener must not store the word before the data is in.
      ByteBuffer burst = ByteBuffer.allocate(
          TcpWire.FRAME_HEADER_BYTES + TcpWire.ENTRY_BYTES + length + 300);
      burst.put(TcpWire.OP_WRITE).putInt(remote.regionId()).putInt(1).putLong(0).putLong(length)
          .put(Patterns.bytes(src, 0, length)).put(wordFrame(words.name(), 4, 77));
      try (Socket raw = connect(remote)) {
        raw.getOutputStream().write(hello(remote.token()));
        assertEquals("OK", readAck(raw));
        Thread sender = new Thread(() -> {
          try {
            raw.getOutputStream().write(burst.array(), 0, burst.position());
          } catch (IOException e) {
            throw new java.io.UncheckedIOException(e);
          }
        });
        sender.start();
        assertTrue(words.awaitAtLeast(4, 77, TIMEOUT_NS) > 0, "the word never landed");
        assertEquals(Patterns.crc(src, 0, length), Patterns.crc(dst, 0, length),
            "the word was visible before every byte of the frame before it");
        sender.join();
        assertEquals("OK", readAck(raw), "the write");
        assertEquals("OK", readAck(raw), "the word");
      }
    }
  }

  @Test
  void tcpListenerRefusesAWordForAFileThatIsNotDsAndKeepsServing() throws Exception {
    try (TcpTransport d = new TcpTransport(peer,
            TransportOptions.defaults().withIoTimeout(Duration.ofSeconds(5)));
        TcpTransport p = new TcpTransport(ours, TransportOptions.defaults().withTcpListener(false));
        SharedDoneWords foreign = SharedDoneWords.create(SharedDoneWords.PEER_DIR,
            "kvferry-done-foreign-" + ProcessHandle.current().pid() + "-"
                + Long.toHexString(System.nanoTime()), SLOTS)) {
      d.acceptDoneWords(words);
      RegionDescriptor remote = d.describe(dst);
      // A well-formed name of a file this D never accepted (another process's, say).
      TransferStatus refused = Patterns.await(p.openPeerDoneWords(foreign.name(), SLOTS)
          .storeAfter(List.of(), src, remote, 1, 99));
      assertTrue(refused.failureMessage().contains("not a done-word file of D0"),
          refused::toString);
      assertEquals(0, foreign.get(1));
      assertEquals(0, words.get(1));

      // Withdrawn words are refused too.
      d.withdrawDoneWords(words);
      TransferStatus withdrawn = Patterns.await(p.openPeerDoneWords(words.name(), SLOTS)
          .storeAfter(List.of(), src, remote, 1, 99));
      assertTrue(withdrawn.failureMessage().contains("not a done-word file of D0"),
          withdrawn::toString);
      assertEquals(0, words.get(1));

      // A slot outside D's file, sent raw: refused by the listener, nothing stored.
      d.acceptDoneWords(words);
      try (Socket raw = connect(remote)) {
        raw.getOutputStream().write(hello(remote.token()));
        assertEquals("OK", readAck(raw));
        raw.getOutputStream().write(wordFrame(words.name(), SLOTS, 99));
        String ack = readAck(raw);
        assertTrue(ack.contains("holds " + SLOTS + " words"), ack);
      }

      // P refuses a name that is no kvferry done-word file before anything is sent.
      assertThrows(IllegalArgumentException.class, () -> p.openPeerDoneWords("../../etc/x", SLOTS));

      // The listener still serves the data and D's own words.
      TransferStatus written = p.write(src, remote, whole);
      TransferStatus stored = p.openPeerDoneWords(words.name(), SLOTS)
          .storeAfter(List.of(written), src, remote, 2, 3);
      assertTrue(Patterns.await(stored).succeeded(), stored::toString);
      assertEquals(3, words.get(2));
      assertEquals(Patterns.crc(src, 0, LENGTH), Patterns.crc(dst, 0, LENGTH));
    }
  }

  private static Socket connect(RegionDescriptor remote) throws IOException {
    Socket s = new Socket(remote.tcpHost(), remote.tcpPort());
    s.setSoTimeout(30_000); // a deadline against hangs, not a timing assertion
    return s;
  }

  private static byte[] hello(byte[] token) {
    return ByteBuffer.allocate(6 + token.length).putInt(TcpWire.MAGIC).put((byte) TcpWire.VERSION)
        .put((byte) token.length).put(token).array();
  }

  private static byte[] wordFrame(String name, int slot, long value) {
    byte[] n = name.getBytes(StandardCharsets.US_ASCII);
    return ByteBuffer.allocate(TcpWire.FRAME_HEADER_BYTES + Long.BYTES + n.length)
        .put(TcpWire.OP_DONE_WORD).putInt(slot).putInt(n.length).putLong(value).put(n).array();
  }

  /** "OK", or the listener's reason. */
  private static String readAck(Socket s) throws IOException {
    DataInputStream in = new DataInputStream(s.getInputStream());
    int status = in.readUnsignedByte();
    byte[] message = new byte[in.readUnsignedShort()];
    in.readFully(message);
    return status == 0 ? "OK" : new String(message, StandardCharsets.UTF_8);
  }
}
