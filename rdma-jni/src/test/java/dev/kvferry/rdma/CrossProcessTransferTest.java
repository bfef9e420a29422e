package dev.kvferry.rdma;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvferry.rdma.testing.ChildJvm;
import java.time.Duration;
import java.util.Base64;
import java.util.List;
import java.util.Random;
import java.util.zip.CRC32C;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/**
 * Real separate processes: a child JVM ({@link ChildRegionHolder}) holds a region; this JVM writes
 * and reads it through cma and tcp, and the child reads ours. Bytes are compared at the
 * destination, byte for byte, and by the child's own checksum.
 */
class CrossProcessTransferTest {
  private static final int BLOCK = 16 * 1024;
  private static final int BLOCKS = 256;
  private static final int REGION = BLOCK * BLOCKS;
  private static final Duration REPLY = Duration.ofSeconds(60);

  private static ChildJvm child;
  private static RegionDescriptor childCma;
  private static RegionDescriptor childTcp;
  private static RegionRegistry registry;
  private static MemoryRegion source;
  private static MemoryRegion scratch;
  private static CmaTransport cma;
  private static TcpTransport tcp;

  @BeforeAll
  static void startChild() throws Exception {
    registry = new RegionRegistry("parent");
    source = registry.allocateHost(REGION);
    scratch = registry.allocateHost(REGION);
    cma = new CmaTransport();
    tcp = new TcpTransport(registry, TransportOptions.defaults());
    child =
        ChildJvm.start(
            ChildRegionHolder.class.getName(),
            List.of("-Xmx64m", "-XX:TieredStopAtLevel=1", "-Xshare:auto"),
            List.of(String.valueOf(REGION)));
    childCma = descriptor(child.awaitLine("DESCRIPTOR cma ", REPLY));
    childTcp = descriptor(child.awaitLine("DESCRIPTOR tcp ", REPLY));
  }

  @AfterAll
  static void stopChild() {
    try {
      if (child != null) {
        child.close();
      }
    } finally {
      if (tcp != null) {
        tcp.close();
      }
      if (cma != null) {
        cma.close();
      }
      registry.close();
    }
  }

  @Test
  void writesShuffledBlocksIntoAnotherProcessThroughCma() throws Exception {
    writeAndVerify(cma, childCma, 11);
  }

  @Test
  void writesShuffledBlocksIntoAnotherProcessThroughTcp() throws Exception {
    writeAndVerify(tcp, childTcp, 12);
  }

  @Test
  void readsShuffledBlocksOfAnotherProcessThroughCma() throws Exception {
    readAndVerify(cma, childCma, 21);
  }

  @Test
  void readsShuffledBlocksOfAnotherProcessThroughTcp() throws Exception {
    readAndVerify(tcp, childTcp, 22);
  }

  @Test
  void childReadsOurRegionThroughCma() throws Exception {
    childReadsOurs("cma", cma.describe(source), 31);
  }

  @Test
  void cmaCopiesThroughItsMappingOfTheChildsPages() throws Exception {
    writeAndVerify(cma, childCma, 13);
    assertNull(cma.unmappedReason(childCma), "the child's region was not mapped");
    assertTrue(cma.mappedPeerRegions() >= 1);
  }

  @Test
  void childReadsOurRegionThroughTcp() throws Exception {
    childReadsOurs("tcp", tcp.describe(source), 32);
  }

  @Test
  void failsCleanlyNamingThePeerWhenItsProcessIsKilled() throws Exception {
    RegionDescriptor deadCma;
    RegionDescriptor deadTcp;
    int mappedBefore;
    ChildJvm doomed =
        ChildJvm.start(
            ChildRegionHolder.class.getName(),
            List.of("-Xmx64m", "-XX:TieredStopAtLevel=1", "-Xshare:auto"),
            List.of("65536"));
    try {
      deadCma = descriptor(doomed.awaitLine("DESCRIPTOR cma ", REPLY));
      deadTcp = descriptor(doomed.awaitLine("DESCRIPTOR tcp ", REPLY));
      // Mapped while alive: the mapping outlives the child, and must not hide its death.
      int before = cma.peerRegionsMappedTotal();
      mappedBefore = cma.mappedPeerRegions();
      TransferStatus alive = Patterns.await(cma.write(source, deadCma,
          new TransferBatch(new long[] {0}, new long[] {0}, new long[] {4096})));
      assertTrue(alive.succeeded(), alive::toString);
      assertEquals(before + 1, cma.peerRegionsMappedTotal(), "the live child's pages were mapped");
      doomed.kill(); // as kill -9
      assertTrue(doomed.awaitExit(REPLY).isPresent(), "the child outlived kill -9");
    } finally {
      doomed.close();
    }
    TransferBatch batch = new TransferBatch(new long[] {0}, new long[] {0}, new long[] {4096});
    TransferStatus viaCma = Patterns.await(cma.write(source, deadCma, batch));
    assertEquals(
        "cma: peer process " + doomed.pid() + " of child-" + doomed.pid()
            + " is gone (ESRCH from process_vm_writev)",
        viaCma.failureMessage());
    assertEquals(mappedBefore, cma.mappedPeerRegions(), "the dead child's mapping is dropped");
    TransferStatus viaTcp = Patterns.await(tcp.write(source, deadTcp, batch));
    assertTrue(
        viaTcp.failureMessage().startsWith(
            "tcp write to " + deadTcp.tcpHost() + ":" + deadTcp.tcpPort() + " (child-"
                + doomed.pid() + ") failed: "),
        viaTcp.failureMessage());
  }

  private static void writeAndVerify(Transport transport, RegionDescriptor remote, long seed)
      throws Exception {
    Patterns.fill(source, 0, REGION, seed);
    int[] from = shuffled(seed);
    int[] to = shuffled(seed + 1000);
    TransferStatus status = Patterns.await(transport.write(source, remote, batch(from, to)));
    assertTrue(status.succeeded(), status::toString);
    assertEquals(REGION, status.bytesMoved());

    // The child's own view of its region: the blocks in destination order.
    CRC32C expected = new CRC32C();
    int[] sourceOfDestination = new int[BLOCKS];
    for (int i = 0; i < BLOCKS; i++) {
      sourceOfDestination[to[i]] = from[i];
    }
    for (int d = 0; d < BLOCKS; d++) {
      expected.update(source.buffer((long) sourceOfDestination[d] * BLOCK, BLOCK));
    }
    assertEquals(
        String.valueOf(expected.getValue()), child.request("CRC 0 " + REGION, "CRC ", REPLY));

    // And byte for byte, read back in one contiguous batch.
    TransferStatus back =
        Patterns.await(
            transport.read(
                scratch, remote, new TransferBatch(new long[] {0}, new long[] {0}, new long[] {REGION})));
    assertTrue(back.succeeded(), back::toString);
    for (int d = 0; d < BLOCKS; d++) {
      assertArrayEquals(
          Patterns.bytes(source, (long) sourceOfDestination[d] * BLOCK, BLOCK),
          Patterns.bytes(scratch, (long) d * BLOCK, BLOCK),
          "block " + d + " at the destination");
    }
  }

  private static void readAndVerify(Transport transport, RegionDescriptor remote, long seed)
      throws Exception {
    assertEquals("", child.request("FILL " + seed + " 0 " + REGION, "OK", REPLY));
    int[] from = shuffled(seed); // blocks of the child
    int[] to = shuffled(seed + 1000); // blocks of ours
    TransferStatus status = Patterns.await(transport.read(scratch, remote, batch(to, from)));
    assertTrue(status.succeeded(), status::toString);
    for (int i = 0; i < BLOCKS; i++) {
      byte[] expected = new byte[BLOCK];
      for (int b = 0; b < BLOCK; b++) {
        expected[b] = Patterns.at(seed, (long) from[i] * BLOCK + b);
      }
      assertArrayEquals(expected, Patterns.bytes(scratch, (long) to[i] * BLOCK, BLOCK), "block " + i);
    }
  }

  private static void childReadsOurs(String transport, RegionDescriptor ours, long seed)
      throws Exception {
    Patterns.fill(source, 0, REGION, seed);
    String reply =
        child.request(
            "READ " + transport + " " + Base64.getEncoder().encodeToString(ours.pack())
                + " 0 0 " + REGION + " " + BLOCK,
            "",
            REPLY);
    CRC32C expected = new CRC32C();
    expected.update(source.buffer(0, REGION));
    assertEquals("OK " + expected.getValue(), reply);
  }

  private static TransferBatch batch(int[] localBlocks, int[] remoteBlocks) {
    long[] lo = new long[BLOCKS];
    long[] ro = new long[BLOCKS];
    long[] sz = new long[BLOCKS];
    for (int i = 0; i < BLOCKS; i++) {
      lo[i] = (long) localBlocks[i] * BLOCK;
      ro[i] = (long) remoteBlocks[i] * BLOCK;
      sz[i] = BLOCK;
    }
    return new TransferBatch(lo, ro, sz);
  }

  private static int[] shuffled(long seed) {
    int[] order = new int[BLOCKS];
    for (int i = 0; i < BLOCKS; i++) {
      order[i] = i;
    }
    Random r = new Random(seed);
    for (int i = BLOCKS - 1; i > 0; i--) {
      int j = r.nextInt(i + 1);
      int t = order[i];
      order[i] = order[j];
      order[j] = t;
    }
    return order;
  }

  private static RegionDescriptor descriptor(String base64) throws MalformedDescriptorException {
    return RegionDescriptor.unpack(Base64.getDecoder().decode(base64));
  }
}
