package dev.kvferry.rdma;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assumptions.assumeFalse;

import dev.kvferry.rdma.cuda.Cuda;
import dev.kvferry.rdma.cuda.CudaUnavailableException;
import java.io.IOException;
import java.util.ArrayList;
import java.util.List;
import java.util.Random;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

/**
 * What holds for GPU memory over tcp on any host: the staging options, how a frame's entries are
 * cut into chunks, and (without CUDA) a clear refusal with nothing moved. The transfers on a GPU
 * are {@link TcpStagingGpuTest}.
 */
class TcpStagingTest {
  private static final byte GUARD = (byte) 0x5A;

  private RegionRegistry ours;
  private RegionRegistry peer;
  private TcpTransport client;
  private TcpTransport server;

  @BeforeEach
  void open() throws IOException {
    ours = new RegionRegistry("P0");
    peer = new RegionRegistry("D0");
    client = new TcpTransport(ours, TransportOptions.defaults().withTcpListener(false));
    server = new TcpTransport(peer, TransportOptions.defaults());
  }

  @AfterEach
  void close() {
    client.close();
    server.close();
    ours.close();
    peer.close();
  }

  @Test
  void stagesThroughTwoBuffersOfFourMiBByDefaultAndRefusesNonsense() {
    TransportOptions d = TransportOptions.defaults();
    assertEquals(2, d.tcpStagingBuffers());
    assertEquals(4 << 20, d.tcpStagingBufferBytes());
    TransportOptions one = d.withTcpStaging(1, 1 << 20).withIoThreads(3);
    assertEquals(1, one.tcpStagingBuffers());
    assertEquals(1 << 20, one.tcpStagingBufferBytes());
    assertThrows(IllegalArgumentException.class, () -> d.withTcpStaging(0, 1 << 20));
    assertThrows(IllegalArgumentException.class, () -> d.withTcpStaging(2, 100));
    assertThrows(IllegalArgumentException.class, () -> d.withTcpStaging(17, 1 << 20));
  }

  @Test
  void cursorCutsEntriesIntoChunksAndMergesNeighboursOnTheDevice() {
    // Entries 0 and 1 are neighbours (one run), 2 is empty, 3 stands alone, 4 follows 3.
    long[] offsets = {100, 110, 500, 200, 230};
    long[] lengths = {10, 20, 0, 30, 5};
    PinnedStaging.EntryCursor c = new PinnedStaging.EntryCursor();
    assertEquals(65, c.reset(offsets, lengths, 5));
    assertEquals(30, c.nextRun(64));
    assertEquals(100, c.runOffset());
    assertEquals(34, c.nextRun(34)); // 30 of entry 3 and 4 of entry 4, adjacent
    assertEquals(200, c.runOffset());
    assertEquals(1, c.nextRun(64));
    assertEquals(234, c.runOffset());
  }

  @Test
  void cursorVisitsEveryByteOnceInOrderForAnyChunkSize() {
    Random random = new Random(11);
    for (int round = 0; round < 200; round++) {
      int count = 1 + random.nextInt(40);
      long[] offsets = new long[count];
      long[] lengths = new long[count];
      List<Long> expected = new ArrayList<>();
      long next = 0;
      for (int i = 0; i < count; i++) {
        offsets[i] = random.nextBoolean() ? next : next + 1 + random.nextInt(50);
        lengths[i] = random.nextInt(5) == 0 ? 0 : 1 + random.nextInt(70);
        for (long b = 0; b < lengths[i]; b++) {
          expected.add(offsets[i] + b);
        }
        next = offsets[i] + lengths[i];
      }
      PinnedStaging.EntryCursor c = new PinnedStaging.EntryCursor();
      long total = c.reset(offsets, lengths, count);
      assertEquals(expected.size(), total);
      int chunk = 1 + random.nextInt(100);
      List<Long> visited = new ArrayList<>();
      long done = 0;
      while (done < total) {
        long inChunk = Math.min(chunk, total - done);
        long at = 0;
        while (at < inChunk) {
          long run = c.nextRun(inChunk - at);
          assertTrue(run > 0 && run <= inChunk - at, "run of " + run);
          for (long b = 0; b < run; b++) {
            visited.add(c.runOffset() + b);
          }
          at += run;
        }
        done += inChunk;
      }
      assertEquals(expected, visited, "round " + round);
    }
  }

  @Test
  void hostTransfersAllocateNoPinnedBuffers() {
    MemoryRegion src = ours.allocateHost(1 << 20);
    MemoryRegion dst = peer.allocateHost(1 << 20);
    TransferStatus s =
        Patterns.await(client.write(src, server.describe(dst), single(0, 0, 1 << 20)));
    assertTrue(s.succeeded(), s::toString);
    assertEquals(0, client.stagingLanes());
    assertEquals(0, server.stagingLanes());
  }

  @Test
  void refusesALocalGpuRegionWithTheReasonWhenCudaIsAbsent() {
    assumeFalse(Cuda.available(), "this host has CUDA");
    MemoryRegion backing = ours.allocateHost(4096);
    MemoryRegion gpu = ours.registerExternal(backing.address(), 4096, RegionKind.CUDA, 0);
    MemoryRegion dst = peer.allocateHost(4096);
    Patterns.fillConstant(dst, GUARD);
    TransferStatus s = client.write(gpu, server.describe(dst), single(0, 0, 4096));
    assertFalse(s.succeeded());
    assertTrue(
        s.failureMessage().startsWith(
            "tcp: local region " + gpu.id() + " is GPU memory and CUDA not available: "),
        s.failureMessage());
    assertTrue(s.failureMessage().endsWith("; nothing was moved"), s.failureMessage());
    CmaTransportTest.assertGuard(dst, GUARD);
  }

  @Test
  void listenerRefusesItsGpuRegionWithTheReasonWhenCudaIsAbsent() {
    assumeFalse(Cuda.available(), "this host has CUDA");
    MemoryRegion backing = peer.allocateHost(4096);
    Patterns.fillConstant(backing, GUARD);
    MemoryRegion gpu = peer.registerExternal(backing.address(), 4096, RegionKind.CUDA, 0);
    CudaUnavailableException e =
        assertThrows(CudaUnavailableException.class, () -> server.describe(gpu));
    assertTrue(e.getMessage().startsWith("CUDA not available: "), e.getMessage());
    // A peer that describes it anyway (say, one with CUDA) is refused per frame.
    RegionDescriptor host = server.describe(backing);
    RegionDescriptor forged =
        new RegionDescriptor(gpu.id(), 4096, RegionKind.CUDA, 0, "D0", host.pid(),
            gpu.address(), host.bootId(), host.tcpHost(), host.tcpPort(), host.token(), null);
    MemoryRegion src = ours.allocateHost(4096);
    Patterns.fill(src, 0, 4096, 3);
    for (boolean write : new boolean[] {true, false}) {
      TransferStatus s =
          Patterns.await(
              write ? client.write(src, forged, single(0, 0, 64))
                  : client.read(src, forged, single(0, 0, 64)));
      assertFalse(s.succeeded());
      assertTrue(
          s.failureMessage().contains(
              "refused the " + (write ? "write" : "read") + ": region " + gpu.id()
                  + " of D0 is GPU memory and cannot be staged here: "),
          s.failureMessage());
      assertTrue(s.failureMessage().contains("CUDA not available: "), s.failureMessage());
    }
    CmaTransportTest.assertGuard(backing, GUARD);
    assertEquals(0, server.stagingLanes());
  }

  private static TransferBatch single(long local, long remote, long size) {
    return new TransferBatch(new long[] {local}, new long[] {remote}, new long[] {size});
  }
}
