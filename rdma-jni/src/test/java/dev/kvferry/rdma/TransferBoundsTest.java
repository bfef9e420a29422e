package dev.kvferry.rdma;

import java.io.IOException;
import net.jqwik.api.Arbitraries;
import net.jqwik.api.Arbitrary;
import net.jqwik.api.ForAll;
import net.jqwik.api.Property;
import net.jqwik.api.Provide;
import net.jqwik.api.lifecycle.AfterContainer;
import net.jqwik.api.lifecycle.BeforeContainer;

/**
 * Any offset and size, however absurd (negative, past the end, near Long.MAX_VALUE): a transfer
 * either lands exactly in range or fails having written nothing, on both sides (the remote region
 * for writes, the local one for reads), checked with guard bytes over the whole region.
 */
class TransferBoundsTest {
  private static final int LENGTH = 8192;
  private static final byte GUARD = (byte) 0xA5;

  private static RegionRegistry ours;
  private static RegionRegistry peer;
  private static MemoryRegion local;
  private static MemoryRegion remote;
  private static CmaTransport cma;
  private static TcpTransport tcpClient;
  private static TcpTransport tcpServer;

  @BeforeContainer
  static void open() throws IOException {
    ours = new RegionRegistry("P0");
    peer = new RegionRegistry("D0");
    local = ours.allocateHost(LENGTH);
    remote = peer.allocateHost(LENGTH);
    cma = new CmaTransport();
    tcpClient = new TcpTransport(ours, TransportOptions.defaults().withTcpListener(false));
    tcpServer = new TcpTransport(peer, TransportOptions.defaults());
  }

  @AfterContainer
  static void close() {
    tcpClient.close();
    tcpServer.close();
    cma.close();
    ours.close();
    peer.close();
  }

  @Provide
  Arbitrary<Long> offsets() {
    return Arbitraries.oneOf(
        Arbitraries.of(
            -1L, 0L, 1L, LENGTH - 1L, (long) LENGTH, LENGTH + 1L, Long.MAX_VALUE, Long.MIN_VALUE,
            Long.MAX_VALUE - LENGTH, (long) Integer.MAX_VALUE, 1L << 32),
        Arbitraries.longs().between(-2L * LENGTH, 2L * LENGTH));
  }

  @Property(tries = 150)
  void cmaWriteLandsInRangeOrWritesNothing(
      @ForAll("offsets") long localOffset, @ForAll("offsets") long remoteOffset,
      @ForAll("offsets") long size) {
    check(cma, cma.describe(remote), true, localOffset, remoteOffset, size);
  }

  @Property(tries = 150)
  void cmaReadLandsInRangeOrWritesNothing(
      @ForAll("offsets") long localOffset, @ForAll("offsets") long remoteOffset,
      @ForAll("offsets") long size) {
    check(cma, cma.describe(remote), false, localOffset, remoteOffset, size);
  }

  @Property(tries = 150)
  void tcpWriteLandsInRangeOrWritesNothing(
      @ForAll("offsets") long localOffset, @ForAll("offsets") long remoteOffset,
      @ForAll("offsets") long size) {
    check(tcpClient, tcpServer.describe(remote), true, localOffset, remoteOffset, size);
  }

  @Property(tries = 150)
  void tcpReadLandsInRangeOrWritesNothing(
      @ForAll("offsets") long localOffset, @ForAll("offsets") long remoteOffset,
      @ForAll("offsets") long size) {
    check(tcpClient, tcpServer.describe(remote), false, localOffset, remoteOffset, size);
  }

  /**
   * A batch of one good entry and the generated one: the generated entry decides, and a refusal
   * must leave even the good entry's bytes unwritten.
   */
  private static void check(
      Transport transport, RegionDescriptor descriptor, boolean write, long localOffset,
      long remoteOffset, long size) {
    MemoryRegion source = write ? local : remote;
    MemoryRegion destination = write ? remote : local;
    Patterns.fill(source, 0, LENGTH, 77);
    Patterns.fillConstant(destination, GUARD);
    TransferBatch batch =
        new TransferBatch(
            new long[] {0, localOffset}, new long[] {0, remoteOffset}, new long[] {64, size});
    TransferStatus status = Patterns.await(
        write ? transport.write(local, descriptor, batch) : transport.read(local, descriptor, batch));
    boolean inRange = inRange(localOffset, size) && inRange(remoteOffset, size);
    if (!inRange) {
      if (status.succeeded()) {
        throw new AssertionError("out-of-range entry accepted: " + status);
      }
      if (!status.failureMessage().contains("outside region")) {
        throw new AssertionError("unexpected reason: " + status.failureMessage());
      }
      CmaTransportTest.assertGuard(destination, GUARD);
      return;
    }
    if (!status.succeeded()) {
      throw new AssertionError("in-range batch failed: " + status);
    }
    long srcOffset = write ? localOffset : remoteOffset;
    long dstOffset = write ? remoteOffset : localOffset;
    byte[] after = Patterns.bytes(destination, 0, LENGTH);
    for (int i = 0; i < LENGTH; i++) {
      byte expected = GUARD;
      if (i < 64) {
        expected = Patterns.at(77, i);
      }
      if (i >= dstOffset && i < dstOffset + size) {
        expected = Patterns.at(77, srcOffset + (i - dstOffset));
      }
      if (after[i] != expected) {
        throw new AssertionError("byte " + i + " of the destination is " + after[i] + ", expected "
            + expected);
      }
    }
  }

  private static boolean inRange(long offset, long size) {
    return offset >= 0 && size >= 0 && offset <= LENGTH - size;
  }
}
