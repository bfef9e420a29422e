package dev.kvferry.rdma;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.DataInputStream;
import java.io.IOException;
import java.net.InetAddress;
import java.net.ServerSocket;
import java.net.Socket;
import java.time.Duration;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

/** Two TCP transports in one JVM: P0 sends, D0 listens and serves its registry. */
class TcpTransportTest {
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

  /** Blocks 0..n-1 of P to D's blocks in a shuffled order (i * 37 mod n). */
  private static TransferBatch shuffled(int block, int blocks) {
    long[] lo = new long[blocks];
    long[] ro = new long[blocks];
    long[] sz = new long[blocks];
    for (int i = 0; i < blocks; i++) {
      lo[i] = (long) i * block;
      ro[i] = (long) ((i * 37) % blocks) * block;
      sz[i] = block;
    }
    return new TransferBatch(lo, ro, sz);
  }

  @Test
  void writesAndReadsBackShuffledBlocks() {
    int block = 4096;
    int blocks = 64;
    MemoryRegion src = ours.allocateHost((long) block * blocks);
    MemoryRegion dst = peer.allocateHost((long) block * blocks);
    MemoryRegion back = ours.allocateHost((long) block * blocks);
    Patterns.fill(src, 0, block * blocks, 1);
    TransferBatch batch = shuffled(block, blocks);
    long[] lo = batch.localOffsets();
    long[] ro = batch.remoteOffsets();
    TransferStatus w = Patterns.await(client.write(src, server.describe(dst), batch));
    assertTrue(w.succeeded(), w::toString);
    assertEquals((long) block * blocks, w.bytesMoved());
    for (int i = 0; i < blocks; i++) {
      assertArrayEquals(Patterns.bytes(src, lo[i], block), Patterns.bytes(dst, ro[i], block));
    }
    TransferStatus r = Patterns.await(client.read(back, server.describe(dst), batch));
    assertTrue(r.succeeded(), r::toString);
    assertEquals(Patterns.crc(src, 0, block * blocks), Patterns.crc(back, 0, block * blocks));
  }

  @Test
  void aBatchStripedOverSeveralConnectionsLandsWhole() throws IOException {
    TcpTransport striped = new TcpTransport(ours,
        TransportOptions.defaults().withTcpListener(false).withTcpStreams(3).withIoThreads(3));
    try {
      int block = 64 << 10;
      int blocks = 160; // 10 MiB: above the striping threshold
      MemoryRegion src = ours.allocateHost((long) block * blocks);
      MemoryRegion dst = peer.allocateHost((long) block * blocks);
      MemoryRegion back = ours.allocateHost((long) block * blocks);
      Patterns.fill(src, 0, block * blocks, 7);
      TransferBatch batch = shuffled(block, blocks);
      long[] lo = batch.localOffsets();
      long[] ro = batch.remoteOffsets();
      assertTrue(batch.totalBytes() >= TcpTransport.MIN_STRIPE_BYTES);
      TransferStatus w = Patterns.await(striped.write(src, server.describe(dst), batch));
      assertTrue(w.succeeded(), w::toString);
      assertEquals(batch.totalBytes(), w.bytesMoved());
      for (int i = 0; i < blocks; i++) {
        assertArrayEquals(Patterns.bytes(src, lo[i], block), Patterns.bytes(dst, ro[i], block));
      }
      // Parts run in parallel when io threads are free: between 1 and 3 connections were used.
      assertTrue(striped.idleConnections() >= 1 && striped.idleConnections() <= 3);
      TransferStatus r = Patterns.await(striped.read(back, server.describe(dst), batch));
      assertTrue(r.succeeded(), r::toString);
      assertEquals(Patterns.crc(src, 0, block * blocks), Patterns.crc(back, 0, block * blocks));
    } finally {
      striped.close();
    }
  }

  @Test
  void aStripedBatchFailsWithTheReasonOfAStreamThatFailed() throws IOException {
    TcpTransport striped = new TcpTransport(ours,
        TransportOptions.defaults().withTcpListener(false).withTcpStreams(2).withIoThreads(2));
    try {
      int length = 8 << 20;
      MemoryRegion src = ours.allocateHost(length);
      MemoryRegion dst = peer.allocateHost(length);
      RegionDescriptor d = server.describe(dst);
      dst.close();
      TransferStatus s = Patterns.await(striped.write(src, d,
          new TransferBatch(new long[] {0, length / 2}, new long[] {0, length / 2},
              new long[] {length / 2, length / 2})));
      assertFalse(s.succeeded());
      assertTrue(s.failureMessage().contains("is not registered at D0"), s.failureMessage());
      assertTrue(s.failureMessage().contains("one of 2 streams"), s.failureMessage());
      assertTrue(src.tryPin(), "the local region was left pinned or closed");
      src.unpin();
    } finally {
      striped.close();
    }
  }

  @Test
  void splitsBatchesOfMoreEntriesThanOneFrameHolds() {
    int entries = 2 * TcpWire.MAX_ENTRIES + 100;
    MemoryRegion src = ours.allocateHost(entries * 8L);
    MemoryRegion dst = peer.allocateHost(entries * 8L);
    MemoryRegion back = ours.allocateHost(entries * 8L);
    Patterns.fill(src, 0, entries * 8, 2);
    long[] lo = new long[entries];
    long[] ro = new long[entries];
    long[] sz = new long[entries];
    for (int i = 0; i < entries; i++) {
      lo[i] = i * 8L;
      ro[i] = (entries - 1 - i) * 8L;
      sz[i] = i % 10 == 0 ? 0 : 8; // empty entries are skipped, not sent
    }
    TransferBatch batch = new TransferBatch(lo, ro, sz);
    assertTrue(Patterns.await(client.write(src, server.describe(dst), batch)).succeeded());
    assertTrue(Patterns.await(client.read(back, server.describe(dst), batch)).succeeded());
    for (int i = 0; i < entries; i++) {
      if (sz[i] > 0) {
        assertArrayEquals(Patterns.bytes(src, lo[i], 8), Patterns.bytes(back, lo[i], 8), "entry " + i);
      }
    }
  }

  @Test
  void reusesOneConnectionForConsecutiveBatches() {
    MemoryRegion src = ours.allocateHost(4096);
    MemoryRegion dst = peer.allocateHost(4096);
    for (int i = 0; i < 5; i++) {
      assertTrue(Patterns.await(client.write(src, server.describe(dst), single(0, 0, 4096))).succeeded());
    }
    assertEquals(1, server.listenerConnections());
  }

  /**
   * A free port below Linux's ephemeral range (32768 up): a test that closes its listener and
   * binds the same port again must not find it taken by another process's outgoing connection.
   */
  private static int portOutsideTheEphemeralRange() throws IOException {
    java.util.Random rnd = new java.util.Random();
    for (int attempt = 0; attempt < 200; attempt++) {
      int port = 20_000 + rnd.nextInt(12_000);
      try (ServerSocket probe = new ServerSocket()) {
        probe.setReuseAddress(true);
        probe.bind(new java.net.InetSocketAddress("127.0.0.1", port));
        return port;
      } catch (IOException taken) {
        // try another
      }
    }
    throw new IOException("no free port in 20000-31999");
  }

  @Test
  void retriesOnAFreshConnectionWhenThePooledOneDied() throws IOException {
    server.close();
    server = new TcpTransport(peer,
        TransportOptions.defaults().withTcpBind("127.0.0.1", portOutsideTheEphemeralRange()));
    MemoryRegion src = ours.allocateHost(4096);
    MemoryRegion dst = peer.allocateHost(4096);
    RegionDescriptor d = server.describe(dst);
    assertTrue(Patterns.await(client.write(src, d, single(0, 0, 4096))).succeeded());
    server.close(); // kills the pooled connection
    // The closed listener's port is free again once close returns (TcpListener.close).
    server = new TcpTransport(peer,
        TransportOptions.defaults().withTcpBind("127.0.0.1", d.tcpPort()));
    Patterns.fill(src, 0, 4096, 8);
    TransferStatus s = Patterns.await(client.write(src, d, single(0, 0, 4096)));
    assertTrue(s.succeeded(), s::toString);
    assertArrayEquals(Patterns.bytes(src, 0, 4096), Patterns.bytes(dst, 0, 4096));
  }

  @Test
  void aNewTokenAtAnEndpointDropsTheOldIncarnationsIdleConnections() {
    MemoryRegion src = ours.allocateHost(4096);
    MemoryRegion dst = peer.allocateHost(4096);
    RegionDescriptor d = server.describe(dst);
    assertTrue(Patterns.await(client.write(src, d, single(0, 0, 4096))).succeeded());
    assertEquals(1, client.pooledPeers());
    // What a peer restarted at the same endpoint looks like: its descriptors carry a new token.
    // (This listener still has the old one and refuses; the pool is what is checked here.)
    RegionDescriptor restarted = d.withTcp(d.tcpHost(), d.tcpPort(), new byte[] {1, 2, 3, 4});
    assertFalse(Patterns.await(client.write(src, restarted, single(0, 0, 4096))).succeeded());
    assertEquals(1, client.pooledPeers(), "the old incarnation's connections are still pooled");
  }

  @Test
  void aPeerThatLeftHasItsIdleConnectionsClosed() {
    MemoryRegion src = ours.allocateHost(4096);
    MemoryRegion dst = peer.allocateHost(4096);
    RegionDescriptor d = server.describe(dst);
    assertTrue(Patterns.await(client.write(src, d, single(0, 0, 4096))).succeeded());
    assertEquals(1, client.pooledPeers());
    client.peerGone(d);
    assertEquals(0, client.pooledPeers(), "sockets to a peer that left are kept");
  }

  @Test
  void aBatchMovingToAPeerThatLeftFailsAtOnceInsteadOfWaitingOutTheIoTimeout() throws IOException {
    // A peer that accepts and then says nothing: the batch waits for its hello's answer.
    try (java.nio.channels.ServerSocketChannel silent = java.nio.channels.ServerSocketChannel.open();
        TcpTransport patient = new TcpTransport(ours,
            TransportOptions.defaults().withTcpListener(false).withIoTimeout(Duration.ofMinutes(10)))) {
      silent.bind(new java.net.InetSocketAddress("127.0.0.1", 0));
      MemoryRegion src = ours.allocateHost(4096);
      RegionDescriptor gone = server.describe(peer.allocateHost(4096))
          .withTcp("127.0.0.1", ((java.net.InetSocketAddress) silent.getLocalAddress()).getPort(),
              new byte[] {1, 2, 3});
      TransferStatus s = patient.write(src, gone, single(0, 0, 4096));
      try (java.nio.channels.SocketChannel accepted = silent.accept()) {
        assertTrue(accepted.isConnected());
        assertFalse(s.isDone(), "the silent peer answered nothing, so the batch is still moving");
        patient.peerGone(gone);
        TransferStatus ended = Patterns.await(s); // within 60 s, not the 10 min I/O timeout
        assertFalse(ended.succeeded(), ended::toString);
        // A batch queued for it afterwards does not try to connect at all.
        TransferStatus later = Patterns.await(patient.write(src, gone, single(0, 0, 4096)));
        assertTrue(later.failureMessage() != null
            && later.failureMessage().contains("not started: that peer left the cluster"),
            later::toString);
      }
    }
  }

  @Test
  void failsWithTheReceiversReasonWhenItsRegionWasClosed() {
    for (int length : new int[] {4096, 8 << 20}) {
      MemoryRegion src = ours.allocateHost(length);
      MemoryRegion dst = peer.allocateHost(length);
      RegionDescriptor d = server.describe(dst);
      dst.close();
      TransferStatus s = Patterns.await(client.write(src, d, single(0, 0, length)));
      assertFalse(s.succeeded());
      assertTrue(
          s.failureMessage().contains("refused the write: region " + d.regionId()
              + " is not registered at D0"),
          s.failureMessage());
    }
  }

  @Test
  void receiverRefusesRangesPastItsRegionEvenWhenTheDescriptorLies() {
    MemoryRegion src = ours.allocateHost(8192);
    MemoryRegion dst = peer.allocateHost(4096);
    Patterns.fillConstant(dst, (byte) 0x5A);
    Patterns.fill(src, 0, 8192, 4);
    RegionDescriptor real = server.describe(dst);
    RegionDescriptor liar =
        new RegionDescriptor(real.regionId(), 1 << 20, RegionKind.HOST, -1, "D0", real.pid(),
            real.baseAddress(), real.bootId(), real.tcpHost(), real.tcpPort(), real.token(), null);
    TransferBatch batch =
        new TransferBatch(new long[] {0, 4096}, new long[] {0, 4000}, new long[] {16, 200});
    TransferStatus w = Patterns.await(client.write(src, liar, batch));
    assertFalse(w.succeeded());
    assertTrue(w.failureMessage().contains("lies outside region " + dst.id() + " of D0"), w.failureMessage());
    CmaTransportTest.assertGuard(dst, (byte) 0x5A);

    MemoryRegion readInto = ours.allocateHost(8192);
    Patterns.fillConstant(readInto, (byte) 0x33);
    TransferStatus r = Patterns.await(client.read(readInto, liar, batch));
    assertFalse(r.succeeded());
    assertTrue(r.failureMessage().contains("refused the read"), r.failureMessage());
    CmaTransportTest.assertGuard(readInto, (byte) 0x33);
  }

  @Test
  void failsWhenTheTokenIsNotThePeers() {
    MemoryRegion src = ours.allocateHost(4096);
    MemoryRegion dst = peer.allocateHost(4096);
    Patterns.fillConstant(dst, (byte) 1);
    RegionDescriptor d = server.describe(dst);
    RegionDescriptor stale = d.withTcp(d.tcpHost(), d.tcpPort(), new byte[16]);
    TransferStatus s = Patterns.await(client.write(src, stale, single(0, 0, 4096)));
    assertFalse(s.succeeded());
    assertTrue(s.failureMessage().contains("refused our token (bad token for the regions of D0)"), s.failureMessage());
    CmaTransportTest.assertGuard(dst, (byte) 1);
  }

  @Test
  void failsWhenNobodyListens() throws IOException {
    int port;
    try (ServerSocket s = new ServerSocket(0, 1, InetAddress.getLoopbackAddress())) {
      port = s.getLocalPort();
    }
    MemoryRegion src = ours.allocateHost(4096);
    RegionDescriptor d = server.describe(peer.allocateHost(4096)).withTcp("127.0.0.1", port, new byte[16]);
    TransferStatus s = Patterns.await(client.write(src, d, single(0, 0, 16)));
    assertFalse(s.succeeded());
    assertTrue(s.failureMessage().startsWith("tcp write to 127.0.0.1:" + port + " (D0) failed: "), s.failureMessage());
  }

  @Test
  void failsWhenThePeerStopsAnswering() throws Exception {
    try (TcpTransport impatient =
            new TcpTransport(ours, TransportOptions.defaults().withTcpListener(false)
                .withIoTimeout(Duration.ofMillis(300)));
        ServerSocket mute = new ServerSocket(0, 1, InetAddress.getLoopbackAddress())) {
      MemoryRegion local = ours.allocateHost(4096);
      RegionDescriptor d = server.describe(peer.allocateHost(4096))
          .withTcp("127.0.0.1", mute.getLocalPort(), new byte[16]);
      TransferStatus s = impatient.read(local, d, single(0, 0, 4096));
      try (Socket accepted = mute.accept()) {
        // Accept the hello, then say nothing more.
        new DataInputStream(accepted.getInputStream()).readFully(new byte[6 + 16]);
        accepted.getOutputStream().write(new byte[] {0, 0, 0});
        Patterns.await(s);
      }
      assertFalse(s.succeeded());
      assertEquals("tcp read from 127.0.0.1:" + mute.getLocalPort() + " (D0) failed: no progress for 300 ms",
          s.failureMessage());
    }
  }

  @Test
  void describeRefusesRegionsOfAnotherRegistry() {
    MemoryRegion foreign = ours.allocateHost(4096);
    assertThrows(IllegalArgumentException.class, () -> server.describe(foreign));
    assertThrows(IllegalStateException.class, () -> client.describe(foreign));
  }

  private static TransferBatch single(long local, long remote, long size) {
    return new TransferBatch(new long[] {local}, new long[] {remote}, new long[] {size});
  }
}
