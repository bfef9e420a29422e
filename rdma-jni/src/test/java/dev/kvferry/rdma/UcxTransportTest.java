package dev.kvferry.rdma;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assumptions.assumeTrue;

import dev.kvferry.rdma.testing.ChildJvm;
import dev.kvferry.rdma.ucx.Ucx;
import java.time.Duration;
import java.util.Base64;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Random;
import java.util.zip.CRC32C;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.ValueSource;

/**
 * The ucx transport between real processes: a child JVM ({@link ChildRegionHolder}) holds a region
 * and runs UCX with UCX_TLS from its environment; this JVM runs UCX with the same transports
 * through {@link TransportOptions#withUcxTransports}. Each test runs over UCX's TCP transport and
 * over its shared-memory transports (sm: cma, posix, sysv). Bytes are compared at the
 * destination. Skips, with the probe's reason, where libucp is missing.
 */
class UcxTransportTest {
  private static final int BLOCK = 16 * 1024;
  private static final int BLOCKS = 256;
  private static final int REGION = BLOCK * BLOCKS;
  private static final Duration REPLY = Duration.ofSeconds(60);
  private static final List<String> CHILD_JVM =
      List.of("-Xmx64m", "-XX:TieredStopAtLevel=1", "-Xshare:auto");

  private static final String ALLOCATED = "/allocated";
  private static final Map<String, Peer> peers = new HashMap<>();
  private static RegionRegistry registry;
  private static MemoryRegion source;
  private static MemoryRegion scratch;

  /** A child holding a region, and our transport with the same UCX_TLS. */
  private record Peer(ChildJvm child, RegionDescriptor region, UcxTransport transport) {}

  @BeforeAll
  static void needUcx() {
    assumeTrue(Ucx.available(), () -> "UCX not available: " + Ucx.unavailableReason());
    registry = new RegionRegistry("parent");
    source = registry.allocateHost(REGION);
    scratch = registry.allocateHost(REGION);
  }

  @AfterAll
  static void stopPeers() {
    for (Peer p : peers.values()) {
      p.child().close();
      p.transport().close();
    }
    peers.clear();
    if (registry != null) {
      registry.close();
    }
  }

  /**
   * The child for {@code variant}: UCX_TLS, and with {@code /allocated} a region UCX allocated
   * ({@link UcxTransport#allocateHost}) rather than the registry.
   */
  private static Peer peer(String variant) throws Exception {
    Peer p = peers.get(variant);
    if (p == null) {
      String tls = variant.replace(ALLOCATED, "");
      List<String> args = variant.endsWith(ALLOCATED)
          ? List.of(String.valueOf(REGION), "ucx", "ucx") : List.of(String.valueOf(REGION), "ucx");
      ChildJvm child =
          ChildJvm.start(ChildRegionHolder.class.getName(), CHILD_JVM, args, Map.of("UCX_TLS", tls));
      RegionDescriptor region = descriptor(child.awaitLine("DESCRIPTOR ucx ", REPLY));
      UcxTransport transport = new UcxTransport(TransportOptions.defaults().withUcxTransports(tls));
      p = new Peer(child, region, transport);
      peers.put(variant, p);
    }
    return p;
  }

  @ParameterizedTest(name = "UCX_TLS={0}")
  @ValueSource(strings = {"tcp", "sm", "tcp/allocated", "sm/allocated"})
  void writesScatteredBlocksIntoAnotherProcess(String tls) throws Exception {
    Peer peer = peer(tls);
    long seed = tls.hashCode();
    Patterns.fill(source, 0, REGION, seed);
    int[] from = shuffled(seed);
    int[] to = shuffled(seed + 1000);
    TransferStatus status = Patterns.await(peer.transport().write(source, peer.region(), batch(from, to)));
    assertTrue(status.succeeded(), status::toString);
    assertEquals(REGION, status.bytesMoved());

    // The child's own view: the blocks in destination order.
    int[] sourceOfDestination = new int[BLOCKS];
    for (int i = 0; i < BLOCKS; i++) {
      sourceOfDestination[to[i]] = from[i];
    }
    CRC32C expected = new CRC32C();
    for (int d = 0; d < BLOCKS; d++) {
      expected.update(source.buffer((long) sourceOfDestination[d] * BLOCK, BLOCK));
    }
    assertEquals(String.valueOf(expected.getValue()), peer.child().request("CRC 0 " + REGION, "CRC ", REPLY));

    // And byte for byte, read back in one contiguous get.
    TransferStatus back = Patterns.await(peer.transport().read(scratch, peer.region(), whole()));
    assertTrue(back.succeeded(), back::toString);
    for (int d = 0; d < BLOCKS; d++) {
      assertArrayEquals(
          Patterns.bytes(source, (long) sourceOfDestination[d] * BLOCK, BLOCK),
          Patterns.bytes(scratch, (long) d * BLOCK, BLOCK),
          "block " + d + " at the destination");
    }
  }

  @ParameterizedTest(name = "UCX_TLS={0}")
  @ValueSource(strings = {"tcp", "sm", "tcp/allocated", "sm/allocated"})
  void readsScatteredBlocksOfAnotherProcess(String tls) throws Exception {
    Peer peer = peer(tls);
    long seed = tls.hashCode() + 7L;
    assertEquals("", peer.child().request("FILL " + seed + " 0 " + REGION, "OK", REPLY));
    int[] from = shuffled(seed); // the child's blocks
    int[] to = shuffled(seed + 1000); // ours
    TransferStatus status = Patterns.await(peer.transport().read(scratch, peer.region(), batch(to, from)));
    assertTrue(status.succeeded(), status::toString);
    assertEquals(REGION, status.bytesMoved());
    for (int i = 0; i < BLOCKS; i++) {
      byte[] expected = new byte[BLOCK];
      for (int b = 0; b < BLOCK; b++) {
        expected[b] = Patterns.at(seed, (long) from[i] * BLOCK + b);
      }
      assertArrayEquals(expected, Patterns.bytes(scratch, (long) to[i] * BLOCK, BLOCK), "block " + i);
    }
  }

  @ParameterizedTest(name = "UCX_TLS={0}")
  @ValueSource(strings = {"tcp", "sm"})
  void refusesABatchReachingPastThePeersRegionWithNoByteWritten(String tls) throws Exception {
    Peer peer = peer(tls);
    long seed = tls.hashCode() + 13L;
    assertEquals("", peer.child().request("FILL " + seed + " 0 " + REGION, "OK", REPLY));
    String before = peer.child().request("CRC 0 " + REGION, "CRC ", REPLY);
    Patterns.fill(source, 0, REGION, seed + 1);
    // The first entries are fine; the last one ends one byte past the region.
    TransferBatch batch =
        new TransferBatch(
            new long[] {0, BLOCK, 2L * BLOCK},
            new long[] {0, BLOCK, REGION - BLOCK + 1},
            new long[] {BLOCK, BLOCK, BLOCK});
    TransferStatus status = peer.transport().write(source, peer.region(), batch);
    assertTrue(status.isDone(), "refused before anything was queued");
    assertEquals(
        "ucx: range [" + (REGION - BLOCK + 1) + ", " + (REGION - BLOCK + 1) + " + " + BLOCK
            + ") lies outside region " + peer.region().regionId() + " of " + peer.region().owner()
            + " (" + REGION + " bytes); nothing was moved",
        status.failureMessage());
    assertEquals(before, peer.child().request("CRC 0 " + REGION, "CRC ", REPLY));
  }

  @ParameterizedTest(name = "UCX_TLS={0}")
  @ValueSource(strings = {"tcp", "sm"})
  void failsInsteadOfHangingWhenThePeerIsKilledMidTransfer(String tls) throws Exception {
    int bigRegion = 64 << 20;
    try (RegionRegistry own = new RegionRegistry("killer");
        UcxTransport transport = new UcxTransport(TransportOptions.defaults().withUcxTransports(tls))) {
      MemoryRegion big = own.allocateHost(bigRegion);
      ChildJvm doomed =
          ChildJvm.start(ChildRegionHolder.class.getName(), CHILD_JVM,
          List.of(String.valueOf(bigRegion), "ucx"),
              Map.of("UCX_TLS", tls));
      RegionDescriptor remote;
      try {
        remote = descriptor(doomed.awaitLine("DESCRIPTOR ucx ", REPLY));
        // One warm-up batch opens the endpoint, so the next one is pure data.
        assertTrue(Patterns.await(transport.write(big, remote, blocks(1 << 20, BLOCK))).succeeded());
        TransferStatus midTransfer = transport.write(big, remote, blocks(bigRegion, BLOCK));
        doomed.kill(); // as kill -9, while the 64 MiB batch is (most likely) on the wire
        assertTrue(doomed.awaitExit(REPLY).isPresent(), "the child outlived kill -9");
        // Terminal either way: it finished before the kill landed, or it failed; never pending.
        Patterns.await(midTransfer);
        if (!midTransfer.succeeded()) {
          assertTrue(
              midTransfer.failureMessage().startsWith("ucx write to region " + remote.regionId() + " of "
                  + remote.owner() + " failed: "),
              midTransfer.failureMessage());
        }
      } finally {
        doomed.close();
      }
      // With the peer certainly gone, the next batch fails too, naming the peer.
      TransferStatus after = Patterns.await(transport.write(big, remote, blocks(bigRegion, BLOCK)));
      assertFalse(after.succeeded(), after::toString);
      assertTrue(
          after.failureMessage().contains("region " + remote.regionId() + " of " + remote.owner()),
          after.failureMessage());
    }
  }

  @Test
  void regionsUcxAllocatesAreZeroedDescribedAndClosedWithTheTransport() {
    try (RegionRegistry own = new RegionRegistry("allocating")) {
      UcxTransport transport = new UcxTransport(TransportOptions.defaults().withUcxTransports("sm"));
      MemoryRegion kept;
      try {
        kept = transport.allocateHost(own, 3L * BLOCK + 5);
        MemoryRegion dropped = transport.allocateHost(own, BLOCK);
        assertEquals(3L * BLOCK + 5, kept.lengthBytes());
        assertEquals(RegionKind.HOST, kept.kind());
        assertArrayEquals(new byte[3 * BLOCK + 5], Patterns.bytes(kept, 0, 3 * BLOCK + 5));
        assertTrue(transport.describe(kept).ucxRkey().length > 0);
        dropped.close(); // unmapped from UCX, which frees it
        assertNull(own.lookup(dropped.id()));
        assertThrows(IllegalArgumentException.class, () -> transport.allocateHost(own, 0));
      } finally {
        transport.close();
      }
      assertTrue(kept.isClosed(), "closing the transport closes the regions UCX allocated");
      assertNull(own.lookup(kept.id()));
      assertThrows(IllegalStateException.class, () -> transport.allocateHost(own, BLOCK));
    }
  }

  @Test
  void descriptorsCarryTheWorkerAddressAndRemoteKeyThroughMsgpack() throws Exception {
    Peer peer = peer("tcp");
    RegionDescriptor ours = peer.transport().describe(source);
    assertTrue(ours.ucxWorkerAddress().length > 0);
    assertTrue(ours.ucxRkey().length > 0);
    assertEquals(ours, RegionDescriptor.unpack(ours.pack()));
  }

  @Test
  void aDescriptorWithoutUcxFieldsIsRefusedNamingTheFix() throws Exception {
    Peer peer = peer("tcp");
    RegionDescriptor plain = source.descriptor();
    TransferStatus status = peer.transport().write(source, plain, whole());
    assertEquals(
        "region " + source.id() + " of parent has no UCX worker address and remote key in its "
            + "descriptor; describe it with the peer's ucx transport",
        status.failureMessage());
  }

  private static TransferBatch whole() {
    return new TransferBatch(new long[] {0}, new long[] {0}, new long[] {REGION});
  }

  /** {@code totalBytes / blockBytes} blocks at the same offsets on both sides. */
  private static TransferBatch blocks(int totalBytes, int blockBytes) {
    int n = totalBytes / blockBytes;
    long[] offsets = new long[n];
    long[] sizes = new long[n];
    for (int i = 0; i < n; i++) {
      offsets[i] = (long) i * blockBytes;
      sizes[i] = blockBytes;
    }
    return new TransferBatch(offsets, offsets.clone(), sizes);
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
