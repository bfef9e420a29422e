package dev.kvferry.rdma;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Random;
import java.util.concurrent.atomic.AtomicBoolean;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * The cma transport copying through its mapping of the peer's shared region pages (this process
 * plays both sides: it opens its own /proc/PID/fd links like a peer would). Every test checks the
 * bytes at the destination and which path moved them.
 */
class CmaMappedPagesTest {
  private RegionRegistry ours;
  private RegionRegistry peer;
  private CmaTransport cma;

  @BeforeEach
  void open() {
    ours = new RegionRegistry("P0");
    peer = new RegionRegistry("D0");
    cma = new CmaTransport(TransportOptions.defaults().withCmaInlineMaxBytes(64 * 1024));
  }

  @AfterEach
  void close() {
    cma.close();
    ours.close();
    peer.close();
  }

  @Test
  void kvferryHostRegionsAreSealedMemfdsAPeerCanMap() throws Exception {
    MemoryRegion r = peer.allocateHost(3 * 4096 + 5);
    SharedPages pages = r.sharedPages();
    assertNotNull(pages, "memfd_create is in every kernel CI runs on");
    Path link = Path.of(pages.procPath(ProcessHandle.current().pid()));
    assertTrue(Files.readSymbolicLink(link).toString().startsWith("/memfd:kvferry-region"),
        Files.readSymbolicLink(link).toString());
    assertEquals(pages.inode(), ((Number) Files.getAttribute(link, "unix:ino")).longValue());
    // Sealed: the file can neither shrink (a peer's mapping would fault) nor grow.
    int fd = LibC.open(link.toString(), LibC.O_RDWR | LibC.O_CLOEXEC);
    try {
      int seals = LibC.fcntl(fd, LibC.F_GET_SEALS, 0);
      assertEquals(LibC.F_SEAL_SHRINK | LibC.F_SEAL_GROW | LibC.F_SEAL_SEAL,
          seals & (LibC.F_SEAL_SHRINK | LibC.F_SEAL_GROW | LibC.F_SEAL_SEAL));
      assertFalse(tryTruncate(fd, 0), "a sealed region must refuse to shrink");
    } finally {
      LibC.close(fd);
    }
    assertEquals(pages, RegionDescriptor.unpack(r.descriptor().pack()).sharedPages());
  }

  @Test
  void writesAndReadsScatteredBlocksThroughTheMapping() {
    int blocks = 300;
    int block = 4096 + 64; // not page sized: runs join across entries only where both sides do
    MemoryRegion src = ours.allocateHost((long) blocks * block);
    MemoryRegion dst = peer.allocateHost(2L * blocks * block);
    MemoryRegion back = ours.allocateHost((long) blocks * block);
    Patterns.fill(src, 0, blocks * block, 21);
    Random random = new Random(7);
    long[] lo = new long[blocks];
    long[] ro = new long[blocks];
    long[] sz = new long[blocks];
    List<Integer> slots = new ArrayList<>();
    for (int i = 3; i < 2 * blocks; i++) {
      slots.add(i);
    }
    java.util.Collections.shuffle(slots, random);
    for (int i = 0; i < blocks; i++) {
      lo[i] = (long) i * block;
      // The first three are neighbours on both sides, so one run joins; the rest are scattered.
      ro[i] = (long) (i < 3 ? i : slots.get(i - 3)) * block;
      sz[i] = block;
    }
    TransferBatch batch = new TransferBatch(lo, ro, sz);
    assertTrue(Patterns.await(cma.write(src, dst.descriptor(), batch)).succeeded());
    for (int i = 0; i < blocks; i++) {
      assertArrayEquals(Patterns.bytes(src, lo[i], block), Patterns.bytes(dst, ro[i], block),
          "block " + i);
    }
    assertTrue(Patterns.await(cma.read(back, dst.descriptor(), batch)).succeeded());
    assertEquals(Patterns.crc(src, 0, blocks * block), Patterns.crc(back, 0, blocks * block));
    assertEquals(1, cma.peerRegionsMappedTotal(), "one mapping, opened once, served both");
    assertNull(cma.unmappedReason(dst.descriptor()));
  }

  @Test
  void largeBatchOnTheExecutorAndOverlapsInBatchOrder() {
    int length = 4 << 20;
    MemoryRegion src = ours.allocateHost(length);
    MemoryRegion dst = peer.allocateHost(length);
    Patterns.fill(src, 0, length, 9);
    TransferBatch whole = new TransferBatch(new long[] {0}, new long[] {0}, new long[] {length});
    assertTrue(Patterns.await(cma.write(src, dst.descriptor(), whole)).succeeded());
    assertEquals(Patterns.crc(src, 0, length), Patterns.crc(dst, 0, length));

    TransferBatch overlapping =
        new TransferBatch(new long[] {0, 8}, new long[] {104, 100}, new long[] {8, 8});
    assertTrue(Patterns.await(cma.write(src, dst.descriptor(), overlapping)).succeeded());
    assertArrayEquals(Patterns.bytes(src, 8, 8), Patterns.bytes(dst, 100, 8));
    assertArrayEquals(Patterns.bytes(src, 4, 4), Patterns.bytes(dst, 108, 4));
    assertEquals(1, cma.peerRegionsMappedTotal());
  }

  @Test
  void aLargeScatteredBatchIsSharedAmongTheIoThreadsAndEveryByteLands() {
    // 48 KiB blocks (chunks of 1 MiB end inside none of them) plus one 3 MiB run that is cut.
    int block = 48 << 10;
    int blocks = 200;
    int run = 3 << 20;
    int sourceBytes = blocks * block + run;
    MemoryRegion src = ours.allocateHost(sourceBytes);
    MemoryRegion dst = peer.allocateHost(2L * sourceBytes);
    MemoryRegion back = ours.allocateHost(sourceBytes);
    Patterns.fill(src, 0, sourceBytes, 33);
    Patterns.fillConstant(dst, (byte) 0x5A);
    List<Integer> slots = new ArrayList<>();
    for (int i = 0; i < 2 * blocks; i++) {
      slots.add(i);
    }
    java.util.Collections.shuffle(slots, new Random(11));
    long[] lo = new long[blocks + 1];
    long[] ro = new long[blocks + 1];
    long[] sz = new long[blocks + 1];
    for (int i = 0; i < blocks; i++) {
      lo[i] = (long) i * block;
      ro[i] = (long) slots.get(i) * block;
      sz[i] = block;
    }
    lo[blocks] = (long) blocks * block;
    ro[blocks] = 2L * blocks * block; // after every block slot
    sz[blocks] = run;
    TransferBatch batch = new TransferBatch(lo, ro, sz);
    assertTrue(Patterns.await(cma.write(src, dst.descriptor(), batch)).succeeded());
    assertEquals(1, cma.sharedCopies(), "a 12 MiB mapped copy goes to both I/O threads");
    boolean[] written = new boolean[2 * blocks];
    for (int i = 0; i < blocks; i++) {
      written[slots.get(i)] = true;
      assertArrayEquals(Patterns.bytes(src, lo[i], block), Patterns.bytes(dst, ro[i], block),
          "block " + i);
    }
    assertEquals(Patterns.crc(src, lo[blocks], run), Patterns.crc(dst, ro[blocks], run));
    byte[] untouched = new byte[block];
    java.util.Arrays.fill(untouched, (byte) 0x5A);
    for (int slot = 0; slot < 2 * blocks; slot++) {
      if (!written[slot]) {
        assertArrayEquals(untouched, Patterns.bytes(dst, (long) slot * block, block),
            "slot " + slot + " is in no entry");
      }
    }
    assertTrue(Patterns.await(cma.read(back, dst.descriptor(), batch)).succeeded());
    assertEquals(2, cma.sharedCopies(), "the read back is shared too");
    assertEquals(Patterns.crc(src, 0, sourceBytes), Patterns.crc(back, 0, sourceBytes));
  }

  @Test
  void aLargeBatchWithOverlappingDestinationsIsCopiedByOneThreadInBatchOrder() {
    int length = 8 << 20;
    MemoryRegion src = ours.allocateHost(length);
    MemoryRegion dst = peer.allocateHost(length);
    Patterns.fill(src, 0, length, 5);
    // The second entry rewrites bytes the first one wrote, in the first one's last chunk.
    int tail = length - 4096;
    TransferBatch batch = new TransferBatch(
        new long[] {0, 0}, new long[] {0, tail}, new long[] {length, 4096});
    assertTrue(Patterns.await(cma.write(src, dst.descriptor(), batch)).succeeded());
    assertEquals(0, cma.sharedCopies());
    assertArrayEquals(Patterns.bytes(src, 0, 4096), Patterns.bytes(dst, tail, 4096));
    assertEquals(Patterns.crc(src, 0, tail), Patterns.crc(dst, 0, tail));
  }

  @Test
  void aBatchReachingPastTheRegionMovesNothing() {
    MemoryRegion src = ours.allocateHost(8192);
    MemoryRegion dst = peer.allocateHost(4096);
    // The memfd is a page long; the region 4096 bytes: a batch past it must not reach the file.
    Patterns.fill(src, 0, 8192, 3);
    Patterns.fillConstant(dst, (byte) 0x5A);
    TransferBatch past =
        new TransferBatch(new long[] {0, 100}, new long[] {0, 4090}, new long[] {512, 7});
    TransferStatus s = cma.write(src, dst.descriptor(), past);
    assertFalse(s.succeeded());
    assertTrue(s.failureMessage().contains("nothing was moved"), s.failureMessage());
    CmaTransportTest.assertGuard(dst, (byte) 0x5A);
  }

  @Test
  void aDescriptorNamingAnotherFileFallsBackToTheSystemCalls() {
    MemoryRegion src = ours.allocateHost(4096);
    MemoryRegion dst = peer.allocateHost(4096);
    MemoryRegion other = peer.allocateHost(4096);
    Patterns.fill(src, 0, 4096, 4);
    // dst's address with other's fd: the inode check must refuse the mapping; the system calls
    // then write dst by address.
    SharedPages real = dst.sharedPages();
    RegionDescriptor lying = dst.descriptor().withSharedPages(
        new SharedPages(other.sharedPages().fd(), real.device(), real.inode()));
    assertTrue(Patterns.await(cma.write(src, lying, single(4096))).succeeded());
    assertArrayEquals(Patterns.bytes(src, 0, 4096), Patterns.bytes(dst, 0, 4096));
    assertArrayEquals(new byte[4096], Patterns.bytes(other, 0, 4096), "other must be untouched");
    assertEquals(0, cma.peerRegionsMappedTotal());
    assertTrue(cma.unmappedReason(lying).contains("another file"), cma.unmappedReason(lying));
  }

  @Test
  void anUnsealedSharedFileIsCopiedWithTheSystemCalls(@TempDir Path dir) throws Exception {
    // An engine's cache file (mapSharedFile) can be truncated under us: never mapped by peers.
    Path file = dir.resolve("kv");
    Files.write(file, new byte[8192]);
    MemoryRegion dst = peer.mapSharedFile(file, 0, 8192);
    assertNull(dst.sharedPages());
    MemoryRegion src = ours.allocateHost(4096);
    Patterns.fill(src, 0, 4096, 8);
    assertTrue(Patterns.await(cma.write(src, dst.descriptor(), single(4096))).succeeded());
    assertArrayEquals(Patterns.bytes(src, 0, 4096), Patterns.bytes(dst, 0, 4096));
    assertEquals(0, cma.peerRegionsMappedTotal());
  }

  @Test
  void peerGoneUnmapsAndALaterCopyMapsAgain() {
    MemoryRegion src = ours.allocateHost(4096);
    MemoryRegion dst = peer.allocateHost(4096);
    Patterns.fill(src, 0, 4096, 5);
    assertTrue(Patterns.await(cma.write(src, dst.descriptor(), single(4096))).succeeded());
    assertEquals(1, cma.mappedPeerRegions());
    cma.peerGone(ours.allocateHost(16).descriptor()); // another owner: nothing of D0's goes
    assertEquals(1, cma.mappedPeerRegions());
    cma.peerGone(dst.descriptor());
    assertEquals(0, cma.mappedPeerRegions());
    Patterns.fill(src, 0, 4096, 6);
    assertTrue(Patterns.await(cma.write(src, dst.descriptor(), single(4096))).succeeded());
    assertArrayEquals(Patterns.bytes(src, 0, 4096), Patterns.bytes(dst, 0, 4096));
    assertEquals(2, cma.peerRegionsMappedTotal());
  }

  @Test
  void peerGoneDuringCopiesNeverUnmapsUnderACopy() throws Exception {
    int length = 2 << 20; // on the executor: copies and releases really overlap
    MemoryRegion src = ours.allocateHost(length);
    MemoryRegion dst = peer.allocateHost(length);
    Patterns.fill(src, 0, length, 11);
    long expected = Patterns.crc(src, 0, length);
    TransferBatch whole = new TransferBatch(new long[] {0}, new long[] {0}, new long[] {length});
    AtomicBoolean stop = new AtomicBoolean();
    Thread releaser = new Thread(() -> {
      while (!stop.get()) {
        cma.peerGone(dst.descriptor());
        Thread.onSpinWait();
      }
    });
    releaser.start();
    try {
      for (int i = 0; i < 200; i++) {
        TransferStatus s = Patterns.await(cma.write(src, dst.descriptor(), whole));
        assertTrue(s.succeeded(), s::toString);
      }
    } finally {
      stop.set(true);
      releaser.join();
    }
    assertEquals(expected, Patterns.crc(dst, 0, length));
    cma.peerGone(dst.descriptor());
    assertEquals(0, cma.mappedPeerRegions());
  }

  @Test
  void turnedOffItUsesTheSystemCalls() {
    try (CmaTransport syscalls =
        new CmaTransport(TransportOptions.defaults().withCmaMapPeerPages(false))) {
      MemoryRegion src = ours.allocateHost(4096);
      MemoryRegion dst = peer.allocateHost(4096);
      Patterns.fill(src, 0, 4096, 2);
      assertTrue(Patterns.await(syscalls.write(src, dst.descriptor(), single(4096))).succeeded());
      assertArrayEquals(Patterns.bytes(src, 0, 4096), Patterns.bytes(dst, 0, 4096));
      assertEquals(0, syscalls.peerRegionsMappedTotal());
      assertEquals("mapping peer pages is turned off", syscalls.unmappedReason(dst.descriptor()));
    }
  }

  private static boolean tryTruncate(int fd, long length) {
    try {
      LibC.ftruncate(fd, length);
      return true;
    } catch (com.sun.jna.LastErrorException e) {
      return false;
    }
  }

  private static TransferBatch single(long size) {
    return new TransferBatch(new long[] {0}, new long[] {0}, new long[] {size});
  }
}
