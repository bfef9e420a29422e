package dev.kvferry.rdma;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assumptions.assumeFalse;
import static org.junit.jupiter.api.Assumptions.assumeTrue;

import com.sun.jna.Memory;
import com.sun.jna.Pointer;
import dev.kvferry.rdma.cuda.Cuda;
import dev.kvferry.rdma.cuda.CudaEvent;
import dev.kvferry.rdma.cuda.CudaStream;
import dev.kvferry.rdma.cuda.CudaUnavailableException;
import dev.kvferry.rdma.cuda.SharedDoneWords;
import java.util.Random;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.Test;

/** The cuda transport: what holds without a GPU, then copies on one (skipped without). */
class CudaTransportTest {

  private static final long BLOCK = 32 * 1024;

  @Test
  void transportsListCudaAndRefuseItWithTheReasonWithoutAGpu() {
    assertTrue(Transports.NAMES.contains("cuda"));
    assumeFalse(Cuda.available(), "this host has CUDA");
    CudaUnavailableException e =
        assertThrows(
            CudaUnavailableException.class,
            () -> Transports.open("cuda", new RegionRegistry("p"), TransportOptions.defaults()));
    assertTrue(e.getMessage().startsWith("CUDA not available: "), e.getMessage());
  }

  @Test
  void autoCopiesBlocksWithTheKernelAndLargeRunsWithTheBatchCopy() {
    TransferBatch blocks =
        new TransferBatch(new long[] {0, 4 * BLOCK}, new long[] {BLOCK, 0}, new long[] {BLOCK, BLOCK});
    TransferBatch runs = new TransferBatch(new long[] {0}, new long[] {0}, new long[] {64L << 20});
    assertEquals(
        CudaTransport.CopyMethod.KERNEL,
        CudaTransport.methodFor(CudaTransport.CopyMethod.AUTO, blocks));
    assertEquals(
        CudaTransport.CopyMethod.MEMCPY_BATCH,
        CudaTransport.methodFor(CudaTransport.CopyMethod.AUTO, runs));
    assertEquals(
        CudaTransport.CopyMethod.KERNEL,
        CudaTransport.methodFor(CudaTransport.CopyMethod.KERNEL, runs));
  }

  @Test
  void cudaDescriptorKeepsItsIpcHandleAndOffsetThroughMsgpack() throws Exception {
    byte[] handle = new byte[CudaTransport.IPC_DESCRIPTOR_BYTES];
    new Random(7).nextBytes(handle);
    RegionDescriptor d =
        new RegionDescriptor(3, 1 << 20, RegionKind.CUDA, 1, "decode-0", 42, 0x7f0000000000L,
                "boot", "", 0, null, null)
            .withCudaIpcHandle(handle);
    RegionDescriptor back = RegionDescriptor.unpack(d.pack());
    assertEquals(d, back);
    assertArrayEquals(handle, back.cudaIpcHandle());
    assertEquals(RegionKind.CUDA, back.kind());
    assertEquals(1, back.device());
  }

  // ---- on a GPU ---------------------------------------------------------------------------------

  private static void assumeGpu() {
    assumeTrue(Cuda.available(), () -> "CUDA not available: " + Cuda.unavailableReason());
  }

  @Test
  void writesScatteredBlocksBetweenTwoRegionsOfOneGpu() throws Exception {
    assumeGpu();
    Cuda.setDevice(0);
    long bytes = 64 * BLOCK;
    long src = Cuda.malloc(bytes);
    long dst = Cuda.malloc(bytes);
    try (RegionRegistry p = new RegionRegistry("p");
        RegionRegistry d = new RegionRegistry("d");
        CudaTransport t = new CudaTransport();
        Memory host = new Memory(bytes);
        Memory back = new Memory(bytes)) {
      for (long i = 0; i < bytes; i += 8) {
        host.setLong(i, i * 0x9E3779B97F4A7C15L);
      }
      Cuda.memcpy(src, Pointer.nativeValue(host), bytes);
      Cuda.memset(dst, 0, bytes);
      MemoryRegion local = p.registerExternal(src, bytes, RegionKind.CUDA, 0);
      MemoryRegion remote = d.registerExternal(dst, bytes, RegionKind.CUDA, 0);
      TransferBatch batch =
          new TransferBatch(
              new long[] {3 * BLOCK, 10 * BLOCK, 0}, new long[] {0, 63 * BLOCK, 20 * BLOCK},
              new long[] {BLOCK, BLOCK, 2 * BLOCK});
      TransferStatus s = t.write(local, t.describe(remote), batch);
      assertTrue(s.completion().get(10, TimeUnit.SECONDS).succeeded(), s.toString());
      assertEquals(4 * BLOCK, s.bytesMoved());
      Cuda.memcpy(Pointer.nativeValue(back), dst, bytes);
      for (int e = 0; e < batch.count(); e++) {
        for (long i = 0; i < batch.sizes()[e]; i += 8) {
          assertEquals(
              host.getLong(batch.localOffsets()[e] + i), back.getLong(batch.remoteOffsets()[e] + i));
        }
      }
      assertEquals(0, back.getLong(BLOCK));
    } finally {
      Cuda.free(src);
      Cuda.free(dst);
    }
  }

  /**
   * Every request has a plan of its own; past the lane's cache, a retired plan's buffers carry
   * the next one. Each write's bytes are checked where they landed, so a plan uploaded through a
   * staging buffer still in use by an earlier upload would show as wrong bytes.
   */
  @Test
  void plansOfManyRequestsReuseTheirBuffersAndEachMovesItsOwnBlocks() throws Exception {
    assumeGpu();
    Cuda.setDevice(0);
    int blocks = 64;
    long bytes = blocks * BLOCK;
    long src = Cuda.malloc(bytes);
    long dst = Cuda.malloc(bytes);
    int requests = 200;
    try (RegionRegistry p = new RegionRegistry("p");
        RegionRegistry d = new RegionRegistry("d");
        CudaTransport t = new CudaTransport();
        Memory host = new Memory(bytes);
        Memory back = new Memory(BLOCK)) {
      for (long i = 0; i < bytes; i += 8) {
        host.setLong(i, (i + 1) * 0x9E3779B97F4A7C15L);
      }
      Cuda.memcpy(src, Pointer.nativeValue(host), bytes);
      MemoryRegion local = p.registerExternal(src, bytes, RegionKind.CUDA, 0);
      RegionDescriptor remote = t.describe(d.registerExternal(dst, bytes, RegionKind.CUDA, 0));
      for (int r = 0; r < requests; r++) {
        int from = r % blocks;
        int to = (r * 7 + 3) % blocks;
        TransferBatch batch = new TransferBatch(
            new long[] {from * BLOCK}, new long[] {to * BLOCK}, new long[] {BLOCK});
        TransferStatus s = t.write(local, remote, batch);
        assertTrue(s.completion().get(10, TimeUnit.SECONDS).succeeded(), s.toString());
        Cuda.memcpy(Pointer.nativeValue(back), dst + to * BLOCK, BLOCK);
        for (long i = 0; i < BLOCK; i += 8) {
          assertEquals(host.getLong(from * BLOCK + i), back.getLong(i),
              "request " + r + ": block " + from + " -> " + to + ", byte " + i);
        }
      }
      assertTrue(t.planBufferAllocations() < requests / 2,
          "plans reuse retired buffers: " + t.planBufferAllocations() + " allocations for "
              + requests + " plans");
    } finally {
      Cuda.free(src);
      Cuda.free(dst);
    }
  }

  @Test
  void refusesOutOfBoundsBatchesBeforeAnyLaunch() throws Exception {
    assumeGpu();
    Cuda.setDevice(0);
    long a = Cuda.malloc(4 * BLOCK);
    try (RegionRegistry p = new RegionRegistry("p"); CudaTransport t = new CudaTransport()) {
      MemoryRegion local = p.registerExternal(a, 2 * BLOCK, RegionKind.CUDA, 0);
      MemoryRegion remote = p.registerExternal(a + 2 * BLOCK, 2 * BLOCK, RegionKind.CUDA, 0);
      TransferStatus s =
          t.write(local, t.describe(remote),
              new TransferBatch(new long[] {0}, new long[] {BLOCK + 1}, new long[] {BLOCK}));
      assertFalse(s.succeeded());
      assertTrue(s.failureMessage().contains("nothing was moved"), s.failureMessage());
    } finally {
      Cuda.free(a);
    }
  }

  @Test
  void writeAfterStartsOnlyOnceTheLayerEventFires() throws Exception {
    assumeGpu();
    Cuda.setDevice(0);
    long bytes = 8 * BLOCK;
    long src = Cuda.malloc(bytes);
    long dst = Cuda.malloc(bytes);
    try (RegionRegistry r = new RegionRegistry("p");
        CudaTransport t = new CudaTransport();
        CudaStream compute = CudaStream.create(0);
        CudaEvent layer = CudaEvent.create(0, false);
        Memory back = new Memory(8)) {
      Cuda.memset(dst, 0, bytes);
      // The "layer" writes 0x5a everywhere on the compute stream; the copy must see it.
      Cuda.memsetAsync(src, 0x5a, bytes, compute.handle());
      layer.record(compute);
      MemoryRegion local = r.registerExternal(src, bytes, RegionKind.CUDA, 0);
      MemoryRegion remote = r.registerExternal(dst, bytes, RegionKind.CUDA, 0);
      TransferStatus s =
          t.writeAfter(layer, local, t.describe(remote),
              new TransferBatch(new long[] {0}, new long[] {0}, new long[] {bytes}));
      assertTrue(s.completion().get(10, TimeUnit.SECONDS).succeeded(), s.toString());
      Cuda.memcpy(Pointer.nativeValue(back), dst + bytes - 8, 8);
      assertEquals(0x5a5a5a5a5a5a5a5aL, back.getLong(0));
    } finally {
      Cuda.free(src);
      Cuda.free(dst);
    }
  }

  /**
   * Two transfers to one peer share its copy stream. The second waits there for its layer's
   * event (held here behind a gate word the test opens); the first's done word, stored after the
   * second was queued, must still land, not wait behind the second's wait. Then a word stored right behind
   * a transfer's copies, with nothing queued after them, lands from the stream itself.
   */
  @Test
  void aTransfersDoneWordDoesNotWaitForAnotherTransferQueuedBehindIt() throws Exception {
    assumeGpu();
    Cuda.setDevice(0);
    long bytes = 8 * BLOCK;
    long src = Cuda.malloc(bytes);
    long dst = Cuda.malloc(bytes);
    String name = "kvferry-done-cuda-test-" + ProcessHandle.current().pid() + "-"
        + Long.toHexString(System.nanoTime());
    try (RegionRegistry r = new RegionRegistry("p");
        SharedDoneWords decodeWords = SharedDoneWords.create(SharedDoneWords.PEER_DIR, name, 64);
        SharedDoneWords gate = SharedDoneWords.openPeerWords(name, 64);
        CudaTransport t = new CudaTransport();
        CudaStream compute = CudaStream.create(0);
        CudaEvent layer = CudaEvent.create(0, false)) {
      MemoryRegion local = r.registerExternal(src, bytes, RegionKind.CUDA, 0);
      MemoryRegion remote = r.registerExternal(dst, bytes, RegionKind.CUDA, 0);
      RegionDescriptor to = t.describe(remote);
      TransferBatch firstHalf = new TransferBatch(
          new long[] {0}, new long[] {0}, new long[] {4 * BLOCK});
      TransferBatch secondHalf = new TransferBatch(
          new long[] {4 * BLOCK}, new long[] {4 * BLOCK}, new long[] {4 * BLOCK});
      // Landed before the gate shuts: the lane and its kernels are made now (loading a module
      // while a stream waits on the gate would wait for the gate).
      TransferStatus first = t.write(local, to, firstHalf);
      assertTrue(first.completion().get(10, TimeUnit.SECONDS).succeeded(), first.toString());
      // The second transfer's layer: its event fires only once the test opens the gate (slot 63).
      Cuda.streamWaitValue64(compute.handle(), gate.deviceAddress(63), 1);
      layer.record(compute);
      TransferStatus second;
      PeerDoneWords words = t.openPeerDoneWords(name, 64);
      try {
        second = t.writeAfter(layer, local, to, secondHalf);
        TransferStatus stored =
            words.storeAfter(java.util.List.of(first), local, to, 5, 4101);
        assertTrue(decodeWords.awaitAtLeast(5, 4101, TimeUnit.SECONDS.toNanos(30)) > 0,
            "the first transfer's word waits behind the second transfer's layer");
        assertTrue(stored.completion().get(10, TimeUnit.SECONDS).succeeded(), stored.toString());
        assertFalse(second.completion().isDone(), "the gate is still shut: " + second);
      } finally {
        decodeWords.set(63, 1); // open the gate, or closing would wait for the stream forever
      }
      assertTrue(second.completion().get(10, TimeUnit.SECONDS).succeeded(), second.toString());

      TransferStatus third = t.write(local, to, firstHalf);
      TransferStatus storedOnStream =
          words.storeAfter(java.util.List.of(third), local, to, 6, 4102);
      assertTrue(storedOnStream.succeeded(), "queued on the stream at once: " + storedOnStream);
      assertTrue(decodeWords.awaitAtLeast(6, 4102, TimeUnit.SECONDS.toNanos(30)) > 0);
      assertTrue(third.completion().get(10, TimeUnit.SECONDS).succeeded(), third.toString());
      words.close();
    } finally {
      Cuda.free(src);
      Cuda.free(dst);
    }
  }

  @Test
  void aLoadEventRecordedBehindQueuedReadsMakesAnotherStreamWaitForTheirBytes() throws Exception {
    assumeGpu();
    Cuda.setDevice(0);
    long bytes = 64 * BLOCK;
    long src = Cuda.malloc(bytes);
    long dst = Cuda.malloc(bytes);
    try (RegionRegistry p = new RegionRegistry("p");
        RegionRegistry d = new RegionRegistry("d");
        CudaTransport t = new CudaTransport();
        CudaStream engine = CudaStream.create(0);
        CudaEvent loaded = CudaEvent.createInterprocess(0);
        CudaEvent nothing = CudaEvent.createInterprocess(0);
        Memory back = new Memory(8)) {
      byte[] handle = loaded.ipcHandle();
      assertEquals(Cuda.IPC_HANDLE_BYTES, handle.length);
      assertFalse(java.util.Arrays.equals(handle, nothing.ipcHandle()));
      Cuda.memset(src, 0x5a, bytes);
      Cuda.memset(dst, 0, bytes);
      MemoryRegion local = d.registerExternal(dst, bytes, RegionKind.CUDA, 0);
      MemoryRegion remote = p.registerExternal(src, bytes, RegionKind.CUDA, 0);
      RegionDescriptor from = t.describe(remote);
      TransferStatus s = t.read(local, from,
          new TransferBatch(new long[] {0}, new long[] {0}, new long[] {bytes}));
      t.recordAfterCopies(loaded, local, java.util.List.of(from));
      // The engine's stream waits on the GPU; once it is idle, the bytes are there.
      engine.waitFor(loaded);
      engine.synchronize();
      Cuda.memcpy(Pointer.nativeValue(back), dst + bytes - 8, 8);
      assertEquals(0x5a5a5a5a5a5a5a5aL, back.getLong(0));
      assertTrue(s.completion().get(10, TimeUnit.SECONDS).succeeded(), s.toString());

      // Behind no lane (nothing queued to that peer): recorded on the join stream, it fires.
      t.recordAfterCopies(nothing, local, java.util.List.of(cudaRegion(bytes, 0x1000)));
      long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
      while (!nothing.isComplete()) {
        assertTrue(System.nanoTime() < deadline, "an event behind no copies never fired");
        Thread.onSpinWait();
      }
    } finally {
      Cuda.free(src);
      Cuda.free(dst);
    }
  }


  private static RegionDescriptor cudaRegion(long lengthBytes, long baseAddress) {
    return new RegionDescriptor(3, lengthBytes, RegionKind.CUDA, 0, "decode-0",
        ProcessHandle.current().pid(), baseAddress, "boot", "", 0, null, null);
  }

  @Test
  void aRegionOpenedThroughIpcMustLieWithinTheAllocationTheDriverOpenedNotWhatThePeerClaims() {
    // The peer claims 1 MiB at offset 4 KiB; the driver says the allocation has 512 KiB.
    String why = CudaTransport.ipcRangeRefusal(cudaRegion(1 << 20, 0), 4096, 512 << 10);
    assertTrue(why != null && why.contains("driver says has 524288 bytes"), why);
    assertTrue(CudaTransport.ipcRangeRefusal(cudaRegion(1 << 20, 0), -1, 2 << 20) != null);
    assertTrue(CudaTransport.ipcRangeRefusal(cudaRegion(Long.MAX_VALUE, 0), 4096, 2 << 20) != null,
        "no overflow in offset + length");
    assertEquals(null, CudaTransport.ipcRangeRefusal(cudaRegion(1 << 20, 0), 4096, (1 << 20) + 4096));
  }

  @Test
  void aDescriptorClaimingThisProcessReachesOnlyRegionsDescribedHere() {
    java.util.Map<Long, Long> described = java.util.Map.of(0x7f0000000000L, 1L << 20);
    String elsewhere = CudaTransport.sameProcessRefusal(cudaRegion(4096, 0x7f0000100000L), described);
    assertTrue(elsewhere != null && elsewhere.contains("no region was described"), elsewhere);
    String longer = CudaTransport.sameProcessRefusal(cudaRegion(2L << 20, 0x7f0000000000L), described);
    assertTrue(longer != null && longer.contains("has 1048576"), longer);
    assertEquals(null, CudaTransport.sameProcessRefusal(cudaRegion(1 << 20, 0x7f0000000000L), described));
  }
}
