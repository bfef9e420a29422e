package dev.kvferry.rdma;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

/**
 * CMA's system calls within this process (a process may process_vm_writev itself), which reaches
 * every code path but the second process; {@link CrossProcessTransferTest} covers that. Copies
 * through mapped peer pages are {@link CmaMappedPagesTest}'s.
 */
class CmaTransportTest {
  private RegionRegistry ours;
  private RegionRegistry peer;
  private CmaTransport cma;

  @BeforeEach
  void open() {
    ours = new RegionRegistry("P0");
    peer = new RegionRegistry("D0");
    cma = new CmaTransport(
        TransportOptions.defaults().withCmaInlineMaxBytes(64 * 1024).withCmaMapPeerPages(false));
  }

  @AfterEach
  void close() {
    cma.close();
    ours.close();
    peer.close();
  }

  @Test
  void copiesMoreIovecsThanOneSyscallTakes() {
    int blocks = 3 * CmaTransport.IOV_MAX + 7; // several calls, every block its own iovec
    int block = 64;
    MemoryRegion src = ours.allocateHost((long) blocks * block);
    MemoryRegion dst = peer.allocateHost((long) blocks * block * 2);
    Patterns.fill(src, 0, blocks * block, 5);
    long[] lo = new long[blocks];
    long[] ro = new long[blocks];
    long[] sz = new long[blocks];
    for (int i = 0; i < blocks; i++) {
      lo[i] = (long) i * block;
      ro[i] = (long) (blocks - 1 - i) * block * 2; // reversed, with gaps: nothing merges remotely
      sz[i] = block;
    }
    TransferStatus s = Patterns.await(cma.write(src, dst.descriptor(), new TransferBatch(lo, ro, sz)));
    assertTrue(s.succeeded(), s::toString);
    for (int i = 0; i < blocks; i++) {
      assertArrayEquals(Patterns.bytes(src, lo[i], block), Patterns.bytes(dst, ro[i], block), "block " + i);
    }
  }

  @Test
  void largeBatchCompletesInTheBackgroundAndReadsBack() {
    int length = 4 << 20;
    MemoryRegion src = ours.allocateHost(length);
    MemoryRegion dst = peer.allocateHost(length);
    MemoryRegion back = ours.allocateHost(length);
    Patterns.fill(src, 0, length, 9);
    TransferBatch whole = new TransferBatch(new long[] {0}, new long[] {0}, new long[] {length});
    TransferStatus written = Patterns.await(cma.write(src, dst.descriptor(), whole));
    assertTrue(written.succeeded(), written::toString);
    TransferStatus read = Patterns.await(cma.read(back, dst.descriptor(), whole));
    assertTrue(read.succeeded(), read::toString);
    assertEquals(Patterns.crc(src, 0, length), Patterns.crc(back, 0, length));
  }

  @Test
  void overlappingDestinationsAreWrittenInBatchOrder() {
    // Entries out of remote order get sorted for speed, unless destinations overlap: then the
    // later entry must still win, as in a plain loop over the batch.
    MemoryRegion src = ours.allocateHost(4096);
    MemoryRegion dst = peer.allocateHost(4096);
    Patterns.fill(src, 0, 4096, 12);
    TransferBatch writes =
        new TransferBatch(new long[] {0, 8}, new long[] {104, 100}, new long[] {8, 8});
    assertTrue(Patterns.await(cma.write(src, dst.descriptor(), writes)).succeeded());
    assertArrayEquals(Patterns.bytes(src, 8, 8), Patterns.bytes(dst, 100, 8));
    assertArrayEquals(Patterns.bytes(src, 4, 4), Patterns.bytes(dst, 108, 4));

    MemoryRegion into = ours.allocateHost(4096);
    TransferBatch reads =
        new TransferBatch(new long[] {104, 100}, new long[] {8, 0}, new long[] {8, 8});
    assertTrue(Patterns.await(cma.read(into, src.descriptor(), reads)).succeeded());
    assertArrayEquals(Patterns.bytes(src, 0, 8), Patterns.bytes(into, 100, 8));
    assertArrayEquals(Patterns.bytes(src, 12, 4), Patterns.bytes(into, 108, 4));
  }

  @Test
  void refusesABatchWithOneBadEntryWithoutMovingAnyByte() {
    MemoryRegion src = ours.allocateHost(4096);
    MemoryRegion dst = peer.allocateHost(4096);
    Patterns.fill(src, 0, 4096, 3);
    Patterns.fillConstant(dst, (byte) 0xA5);
    TransferBatch batch =
        new TransferBatch(new long[] {0, 100}, new long[] {0, 4000}, new long[] {1024, 200});
    TransferStatus s = cma.write(src, dst.descriptor(), batch);
    assertFalse(s.succeeded());
    assertTrue(s.failureMessage().contains("outside region " + dst.id()), s.failureMessage());
    assertTrue(s.failureMessage().contains("nothing was moved"), s.failureMessage());
    assertGuard(dst, (byte) 0xA5);
  }

  @Test
  void failsNamingThePidWhenThePeerProcessIsGone() throws Exception {
    Process gone = new ProcessBuilder("true").start();
    assertTrue(gone.waitFor(30, TimeUnit.SECONDS));
    MemoryRegion src = ours.allocateHost(4096);
    RegionDescriptor d = peer.allocateHost(4096).descriptor();
    RegionDescriptor dead =
        new RegionDescriptor(d.regionId(), d.lengthBytes(), RegionKind.HOST, -1, "D0", gone.pid(),
            d.baseAddress(), HostIdentity.bootId(), "", 0, null, null);
    TransferStatus s = Patterns.await(cma.write(src, dead, single(0, 0, 128)));
    assertFalse(s.succeeded());
    assertEquals(
        "cma: peer process " + gone.pid() + " of D0 is gone (ESRCH from process_vm_writev)",
        s.failureMessage());
  }

  @Test
  void failsWithEfaultWhenTheRemoteRangeIsNotMapped() {
    MemoryRegion src = ours.allocateHost(4096);
    // Below mmap_min_addr nothing is ever mapped.
    RegionDescriptor unmapped =
        new RegionDescriptor(7, 4096, RegionKind.HOST, -1, "D0", ProcessHandle.current().pid(),
            4096, HostIdentity.bootId(), "", 0, null, null);
    TransferStatus s = Patterns.await(cma.read(src, unmapped, single(0, 0, 4096)));
    assertFalse(s.succeeded());
    assertTrue(s.failureMessage().contains("is not mapped in the peer (EFAULT"), s.failureMessage());
  }

  @Test
  void resumesAfterAShortCountAndSaysWhereItStopped() {
    // Three pages with the middle one unmapped: the kernel copies the first page, returns a
    // short count, and the resumed call hits the hole.
    long pages = LibC.mmap(0, 3 * 4096, LibC.PROT_READ | LibC.PROT_WRITE,
        LibC.MAP_PRIVATE | LibC.MAP_ANONYMOUS, -1, 0);
    try {
      LibC.munmap(pages + 4096, 4096);
      MemoryRegion src = ours.allocateHost(3 * 4096);
      Patterns.fill(src, 0, 3 * 4096, 6);
      RegionDescriptor holey =
          new RegionDescriptor(3, 3 * 4096, RegionKind.HOST, -1, "D0", ProcessHandle.current().pid(),
              pages, HostIdentity.bootId(), "", 0, null, null);
      TransferStatus s = Patterns.await(cma.write(src, holey, single(0, 0, 3 * 4096)));
      assertFalse(s.succeeded());
      assertTrue(s.failureMessage().contains("EFAULT from process_vm_writev after 4096 of 12288 bytes"),
          s.failureMessage());
      byte[] landed = new byte[4096];
      new com.sun.jna.Pointer(pages).read(0, landed, 0, 4096);
      assertArrayEquals(Patterns.bytes(src, 0, 4096), landed);
    } finally {
      LibC.munmap(pages, 4096);
      LibC.munmap(pages + 2 * 4096, 4096);
    }
  }

  @Test
  void refusesAPeerOnAnotherHost() {
    MemoryRegion src = ours.allocateHost(4096);
    RegionDescriptor d = peer.allocateHost(4096).descriptor();
    RegionDescriptor elsewhere =
        new RegionDescriptor(d.regionId(), d.lengthBytes(), RegionKind.HOST, -1, "D0", d.pid(),
            d.baseAddress(), "another-boot-id", "", 0, null, null);
    TransferStatus s = cma.write(src, elsewhere, single(0, 0, 16));
    assertFalse(s.succeeded());
    assertTrue(s.failureMessage().contains("lives on another host"), s.failureMessage());
    assertTrue(s.failureMessage().contains("use the tcp transport"), s.failureMessage());
  }

  @Test
  void refusesDeviceMemory() {
    MemoryRegion src = ours.allocateHost(4096);
    RegionDescriptor d = peer.allocateHost(4096).descriptor();
    RegionDescriptor gpu =
        new RegionDescriptor(d.regionId(), d.lengthBytes(), RegionKind.CUDA, 0, "D0", d.pid(),
            d.baseAddress(), d.bootId(), "", 0, null, null);
    TransferStatus s = cma.write(src, gpu, single(0, 0, 16));
    assertFalse(s.succeeded());
    assertTrue(s.failureMessage().contains("host memory only"), s.failureMessage());
  }

  @Test
  void explainsHowToGrantPtraceWhenNotPermitted() {
    RegionDescriptor d = peer.allocateHost(4096).descriptor();
    String m = CmaTransport.explain(LibC.EPERM, true, d, 0, 16);
    assertTrue(m.contains("EPERM"), m);
    assertTrue(m.contains("pid " + d.pid()), m);
    assertTrue(m.contains("sysctl kernel.yama.ptrace_scope=0"), m);
    assertTrue(m.contains("CAP_SYS_PTRACE"), m);
    assertTrue(m.contains("PR_SET_PTRACER"), m);
  }

  @Test
  void namesOtherErrnos() {
    RegionDescriptor d = peer.allocateHost(4096).descriptor();
    String m = CmaTransport.explain(LibC.EINVAL, false, d, 10, 20);
    assertTrue(m.contains("process_vm_readv"), m);
    assertTrue(m.contains("EINVAL (Invalid argument)"), m);
    assertTrue(m.contains("after 10 of 20 bytes"), m);
  }

  @Test
  void failsWhenTheLocalRegionIsClosed() {
    MemoryRegion src = ours.allocateHost(4096);
    RegionDescriptor d = peer.allocateHost(4096).descriptor();
    src.close();
    TransferStatus s = cma.write(src, d, single(0, 0, 16));
    assertFalse(s.succeeded());
    assertTrue(s.failureMessage().contains("closed"), s.failureMessage());
  }

  private static TransferBatch single(long local, long remote, long size) {
    return new TransferBatch(new long[] {local}, new long[] {remote}, new long[] {size});
  }

  static void assertGuard(MemoryRegion region, byte value) {
    byte[] all = Patterns.bytes(region, 0, (int) region.lengthBytes());
    for (int i = 0; i < all.length; i++) {
      if (all[i] != value) {
        throw new AssertionError("byte " + i + " of region " + region.id() + " was written");
      }
    }
  }
}
