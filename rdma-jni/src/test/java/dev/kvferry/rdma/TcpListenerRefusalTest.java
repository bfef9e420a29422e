package dev.kvferry.rdma;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import ch.qos.logback.classic.Logger;
import ch.qos.logback.classic.spi.ILoggingEvent;
import ch.qos.logback.core.read.ListAppender;
import java.io.DataInputStream;
import java.io.EOFException;
import java.io.IOException;
import java.net.Socket;
import java.net.SocketException;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.List;
import java.util.stream.Stream;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.Arguments;
import org.junit.jupiter.params.provider.MethodSource;
import org.slf4j.LoggerFactory;

/**
 * Hostile or broken clients, speaking raw bytes to a listener: each is answered with its reason
 * (when the bytes got that far), logged and disconnected; no byte lands outside the target range
 * (none at all before a valid token); and a good client on the same listener still succeeds.
 */
class TcpListenerRefusalTest {
  private static final int LENGTH = 64 * 1024;
  private static final byte GUARD = (byte) 0xA5;

  private RegionRegistry peer;
  private RegionRegistry ours;
  private TcpTransport listener;
  private TcpTransport goodClient;
  private MemoryRegion target;
  private RegionDescriptor descriptor;
  private ListAppender<ILoggingEvent> log;

  @BeforeEach
  void open() throws IOException {
    peer = new RegionRegistry("D0");
    ours = new RegionRegistry("P0");
    listener =
        new TcpTransport(peer, TransportOptions.defaults().withIoTimeout(Duration.ofMillis(500)));
    goodClient = new TcpTransport(ours, TransportOptions.defaults().withTcpListener(false));
    target = peer.allocateHost(LENGTH);
    Patterns.fillConstant(target, GUARD);
    descriptor = listener.describe(target);
    log = new ListAppender<>();
    log.start();
    ((Logger) LoggerFactory.getLogger(TcpListener.class)).addAppender(log);
  }

  @AfterEach
  void close() {
    ((Logger) LoggerFactory.getLogger(TcpListener.class)).detachAppender(log);
    goodClient.close();
    listener.close();
    ours.close();
    peer.close();
  }

  static Stream<Arguments> refusals() {
    return Stream.of(
        Arguments.of("wrong token", null, "bad token for the regions of D0"),
        Arguments.of("frame before any hello", frameBytes(TcpWire.OP_WRITE, 1, 0, 0, 64, 64),
            "garbage hello: not a kvferry tcp peer"),
        Arguments.of("unknown op", frameBytes((byte) 0x7F, 1, 1, 0, 64, 64), "garbage frame: unknown op 127"),
        Arguments.of("out-of-range offset", frameBytes(TcpWire.OP_WRITE, 1, 1, LENGTH - 10, 64, 64),
            "range [65526, 65526 + 64) lies outside region 1 of D0 (65536 bytes)"),
        Arguments.of("negative offset", frameBytes(TcpWire.OP_WRITE, 1, 1, -8, 64, 64),
            "range [-8, -8 + 64) lies outside region 1 of D0"),
        Arguments.of("offset near Long.MAX_VALUE", frameBytes(TcpWire.OP_WRITE, 1, 1, Long.MAX_VALUE - 8, 64, 64),
            "lies outside region 1 of D0"),
        Arguments.of("unknown region", frameBytes(TcpWire.OP_WRITE, 999, 1, 0, 64, 64),
            "region 999 is not registered at D0"),
        Arguments.of("oversized entry count", frameBytes(TcpWire.OP_WRITE, 1, 1_000_000, 0, 64, 0),
            "frame of 1000000 entries (expected 1..4096)"),
        Arguments.of("zero entries", frameBytes(TcpWire.OP_WRITE, 1, 0, 0, 64, 0),
            "frame of 0 entries (expected 1..4096)"),
        Arguments.of("oversized entry length", frameBytes(TcpWire.OP_WRITE, 1, 1, 0, 1L << 40, 64),
            "oversized entry of 1099511627776 bytes"),
        Arguments.of("oversized read", frameBytes(TcpWire.OP_READ, 1, 1, 0, LENGTH + 1, 0),
            "range [0, 0 + 65537) lies outside region 1 of D0"));
  }

  @ParameterizedTest(name = "{0}")
  @MethodSource("refusals")
  void refusesDisconnectsAndKeepsServing(String what, byte[] afterHello, String reason)
      throws Exception {
    try (Socket raw = connect()) {
      if (afterHello == null) {
        raw.getOutputStream().write(hello(new byte[16]));
        raw.getOutputStream().write(frameBytes(TcpWire.OP_WRITE, 1, 1, 0, 64, 64));
      } else if (what.equals("frame before any hello")) {
        raw.getOutputStream().write(afterHello);
      } else {
        raw.getOutputStream().write(hello(descriptor.token()));
        assertEquals("OK", readAck(raw));
        raw.getOutputStream().write(afterHello);
      }
      String ack = readAck(raw);
      assertTrue(ack.contains(reason), ack);
      assertClosedByPeer(raw);
    }
    assertLogged(reason);
    CmaTransportTest.assertGuard(target, GUARD);
    assertGoodClientStillSucceeds();
  }

  @Test
  void truncatedPayloadClosesTheConnectionWithoutTouchingBytesOutsideTheTarget() throws Exception {
    try (Socket raw = connect()) {
      raw.getOutputStream().write(hello(descriptor.token()));
      assertEquals("OK", readAck(raw));
      byte[] frame = frameBytes(TcpWire.OP_WRITE, 1, 1, 1024, 4096, 100); // 100 of 4096 bytes
      raw.getOutputStream().write(frame);
      raw.shutdownOutput();
      assertClosedByPeer(raw);
    }
    assertLogged("truncated payload: connection closed after 100 of 4096 bytes");
    byte[] all = Patterns.bytes(target, 0, LENGTH);
    for (int i = 0; i < LENGTH; i++) {
      if ((i < 1024 || i >= 1024 + 4096) && all[i] != GUARD) {
        throw new AssertionError("byte " + i + " outside the target range was written");
      }
    }
    assertGoodClientStillSucceeds();
  }

  @Test
  void truncatedHeaderClosesTheConnection() throws Exception {
    try (Socket raw = connect()) {
      raw.getOutputStream().write(hello(descriptor.token()));
      assertEquals("OK", readAck(raw));
      raw.getOutputStream().write(new byte[] {TcpWire.OP_WRITE, 0, 0});
      raw.shutdownOutput();
      assertClosedByPeer(raw);
    }
    assertLogged("truncated frame header: connection closed after 3 of 9 bytes");
    CmaTransportTest.assertGuard(target, GUARD);
    assertGoodClientStillSucceeds();
  }

  @Test
  void silentClientIsDisconnectedAfterTheIoTimeout() throws Exception {
    try (Socket raw = connect()) {
      assertClosedByPeer(raw); // never said hello
    }
    assertLogged("no progress");
    assertGoodClientStillSucceeds();
  }

  @Test
  void oversizedTokenIsRefused() throws Exception {
    try (Socket raw = connect()) {
      byte[] h = hello(new byte[16]);
      h[5] = (byte) 200;
      raw.getOutputStream().write(h);
      assertEquals("token of 200 bytes (expected 1..64)", readAck(raw));
      assertClosedByPeer(raw);
    }
    assertGoodClientStillSucceeds();
  }

  private void assertGoodClientStillSucceeds() {
    MemoryRegion src = ours.allocateHost(4096);
    Patterns.fill(src, 0, 4096, 42);
    TransferStatus s =
        Patterns.await(
            goodClient.write(
                src, descriptor, new TransferBatch(new long[] {0}, new long[] {8192}, new long[] {4096})));
    assertTrue(s.succeeded(), s::toString);
    assertEquals(Patterns.crc(src, 0, 4096), Patterns.crc(target, 8192, 4096));
  }

  private void assertLogged(String text) {
    // The listener logs from its connection thread; wait for it, with a deadline.
    long deadline = System.nanoTime() + Duration.ofSeconds(30).toNanos();
    while (System.nanoTime() < deadline) {
      List<ILoggingEvent> events = List.copyOf(log.list);
      if (events.stream().anyMatch(e -> e.getFormattedMessage().contains(text))) {
        return;
      }
      Thread.onSpinWait();
    }
    throw new AssertionError("no log line contains '" + text + "': " + log.list);
  }

  private Socket connect() throws IOException {
    Socket s = new Socket(descriptor.tcpHost(), descriptor.tcpPort());
    s.setSoTimeout(30_000); // a deadline against hangs, not a timing assertion
    return s;
  }

  private static byte[] hello(byte[] token) {
    return ByteBuffer.allocate(6 + token.length).putInt(TcpWire.MAGIC).put((byte) TcpWire.VERSION)
        .put((byte) token.length).put(token).array();
  }

  /** A frame of {@code count} declared entries, the first (offset, length), then payload bytes. */
  private static byte[] frameBytes(byte op, int region, int count, long offset, long length, int payload) {
    return ByteBuffer.allocate(TcpWire.FRAME_HEADER_BYTES + TcpWire.ENTRY_BYTES + payload)
        .put(op).putInt(region).putInt(count).putLong(offset).putLong(length)
        .put(new byte[payload])
        .array();
  }

  /** "OK", or the listener's reason. */
  private static String readAck(Socket s) throws IOException {
    DataInputStream in = new DataInputStream(s.getInputStream());
    int status = in.readUnsignedByte();
    byte[] message = new byte[in.readUnsignedShort()];
    in.readFully(message);
    return status == 0 ? "OK" : new String(message, StandardCharsets.UTF_8);
  }

  private static void assertClosedByPeer(Socket s) throws IOException {
    try {
      int b = s.getInputStream().read();
      assertEquals(-1, b, "the listener sent more bytes instead of closing");
    } catch (SocketException | EOFException reset) {
      // reset is a close too
    }
  }
}
