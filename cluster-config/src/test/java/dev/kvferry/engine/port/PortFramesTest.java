package dev.kvferry.engine.port;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.ByteArrayOutputStream;
import java.io.EOFException;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.channels.ReadableByteChannel;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import org.junit.jupiter.api.Test;
import org.msgpack.core.MessageBufferPacker;
import org.msgpack.core.MessagePack;

class PortFramesTest {

  /** A channel that hands out its bytes at most {@code step} at a time, as a socket may. */
  private static ReadableByteChannel trickle(byte[] bytes, int step) {
    ByteBuffer src = ByteBuffer.wrap(bytes);
    return new ReadableByteChannel() {
      @Override
      public int read(ByteBuffer dst) {
        if (!src.hasRemaining()) {
          return -1;
        }
        int n = Math.min(Math.min(step, dst.remaining()), src.remaining());
        ByteBuffer slice = src.slice();
        slice.limit(n);
        dst.put(slice);
        src.position(src.position() + n);
        return n;
      }

      @Override
      public boolean isOpen() {
        return true;
      }

      @Override
      public void close() {}
    };
  }

  private static byte[] frame(byte[] body) {
    return ByteBuffer.allocate(4 + body.length).putInt(body.length).put(body).array();
  }

  private static byte[] frames(byte[]... bodies) {
    ByteArrayOutputStream out = new ByteArrayOutputStream();
    for (byte[] b : bodies) {
      out.writeBytes(frame(b));
    }
    return out.toByteArray();
  }

  private static byte[] packed(PackerBody body) throws IOException {
    try (MessageBufferPacker p = MessagePack.newDefaultBufferPacker()) {
      body.pack(p);
      return p.toByteArray();
    }
  }

  private interface PackerBody {
    void pack(MessageBufferPacker p) throws IOException;
  }

  private static String badFrame(byte[] body) {
    PortException e = assertThrows(PortException.class, () -> PortFrames.decodeMap(body));
    assertEquals(PortError.BAD_FRAME, e.error());
    return e.getMessage();
  }

  @Test
  void everyTypeComesBackAsPlainJava() throws Exception {
    Map<String, Object> in = new LinkedHashMap<>();
    in.put("nil", null);
    in.put("yes", true);
    in.put("small", 7L);
    in.put("negative", -123456789012L);
    in.put("real", 2.5);
    in.put("ascii", "get_finished");
    in.put("utf8", "déjà vu ✓");
    in.put("bin", new byte[] {0, 1, (byte) 0xff});
    in.put("list", List.of(1L, "two", List.of()));
    in.put("map", Map.of("inner", 3L));
    Map<String, Object> out = PortFrames.decodeMap(PortFrames.encode(in));
    assertEquals(in.keySet(), out.keySet());
    for (String k : in.keySet()) {
      if (in.get(k) instanceof byte[] b) {
        assertArrayEquals(b, (byte[]) out.get(k));
      } else {
        assertEquals(in.get(k), out.get(k), k);
      }
    }
  }

  @Test
  void badBodiesAreBadFramesWithTheReason() throws Exception {
    assertTrue(badFrame(packed(p -> p.packArrayHeader(0))).contains("one msgpack map, got array"));
    assertTrue(badFrame(packed(p -> p.packMapHeader(0).packInt(1))).contains("more than one"));
    assertTrue(badFrame(packed(p -> p.packMapHeader(1).packInt(1).packInt(2)))
        .contains("keys must be strings"));
    assertTrue(badFrame(packed(p -> p.packMapHeader(1).packString("n")
        .packBigInteger(java.math.BigInteger.ONE.shiftLeft(63)))).contains("64-bit range"));
    // A string header over bytes that are not UTF-8: refused, not decoded to U+FFFD.
    assertTrue(badFrame(packed(p -> {
      p.packMapHeader(1).packString("s").packRawStringHeader(2);
      p.writePayload(new byte[] {(byte) 0xc3, (byte) 0x28});
    })).contains("not UTF-8"));
    assertTrue(badFrame(packed(p -> p.packMapHeader(1).packString("x")
        .packExtensionTypeHeader((byte) 1, 1).writePayload(new byte[1]))).contains("unsupported"));
    // Declares more entries than it holds: the header is not trusted.
    assertTrue(badFrame(packed(p -> p.packMapHeader(1 << 30))).startsWith("not msgpack"));
    assertTrue(badFrame(new byte[] {(byte) 0xc1}).startsWith("not msgpack")); // never used
    // Strings and binaries claiming more bytes than the frame holds (2 GiB - 16 from 9 bytes
    // sent): refused before anything that size is allocated.
    assertTrue(badFrame(new byte[] {(byte) 0x81, (byte) 0xa1, 0x61, (byte) 0xdb, 0x7f,
        (byte) 0xff, (byte) 0xff, (byte) 0xf0}).contains("more than is left of the frame"));
    assertTrue(badFrame(new byte[] {(byte) 0x81, (byte) 0xa1, 0x61, (byte) 0xc6, 0x7f,
        (byte) 0xff, (byte) 0xff, (byte) 0xf0}).contains("more than is left of the frame"));
    assertTrue(badFrame(new byte[] {(byte) 0x81, (byte) 0xdb, 0x7f, (byte) 0xff, (byte) 0xff,
        (byte) 0xf0}).contains("more than is left of the frame")); // as a key
  }

  @Test
  void deepNestingIsRefusedNotRecursedInto() throws Exception {
    int depth = 100_000; // a stack overflow if decoded recursively without a bound
    byte[] body = packed(p -> {
      p.packMapHeader(1).packString("a");
      for (int i = 0; i < depth; i++) {
        p.packArrayHeader(1);
      }
      p.packNil();
    });
    assertTrue(badFrame(body).contains("nested deeper than " + PortFrames.MAX_DEPTH));
    byte[] allowed = packed(p -> {
      p.packMapHeader(1).packString("a");
      for (int i = 1; i < PortFrames.MAX_DEPTH; i++) { // under the frame's own map
        p.packArrayHeader(1);
      }
      p.packNil();
    });
    Object v = PortFrames.decodeMap(allowed).get("a");
    for (int i = 1; i < PortFrames.MAX_DEPTH; i++) {
      v = ((List<?>) v).get(0);
    }
    assertNull(v);
  }

  @Test
  void theReaderSplitsFramesHoweverTheBytesArrive() throws Exception {
    List<byte[]> bodies = new ArrayList<>();
    for (int i = 0; i < 50; i++) {
      bodies.add(PortFrames.encode(Map.of("op", "n" + i, "args", Map.of("i", (long) i))));
    }
    byte[] big = new byte[300_000]; // larger than the reader's buffer
    Arrays.fill(big, (byte) 7);
    bodies.add(25, PortFrames.encode(Map.of("op", "big", "args", Map.of("b", big))));
    byte[] stream = frames(bodies.toArray(new byte[0][]));
    for (int step : new int[] {1, 3, 4096, stream.length}) {
      PortFrames.Reader r = new PortFrames.Reader(trickle(stream, step), 1024);
      for (int i = 0; i < bodies.size(); i++) {
        Map<String, Object> m = r.next();
        if (i == 25) {
          assertEquals("big", m.get("op"));
          @SuppressWarnings("unchecked")
          Map<String, Object> args = (Map<String, Object>) m.get("args");
          assertArrayEquals(big, (byte[]) args.get("b"));
        } else {
          assertEquals("n" + (i < 25 ? i : i - 1), m.get("op"), "step " + step);
        }
      }
      assertNull(r.next(), "a clean end between frames");
    }
  }

  @Test
  void aSpinningReaderOnASocketReadsFramesThatComeWithinItsSpinAndAfterItAndThenBlocksAgain()
      throws Exception {
    java.nio.file.Path dir = java.nio.file.Files.createTempDirectory("kvferry-frames");
    java.net.UnixDomainSocketAddress at = java.net.UnixDomainSocketAddress.of(dir.resolve("s"));
    try (java.nio.channels.ServerSocketChannel server =
            java.nio.channels.ServerSocketChannel.open(java.net.StandardProtocolFamily.UNIX)) {
      server.bind(at);
      try (java.nio.channels.SocketChannel client = java.nio.channels.SocketChannel.open(at);
          java.nio.channels.SocketChannel accepted = server.accept()) {
        PortFrames.Reader r = new PortFrames.Reader(accepted, 64, 50_000_000L); // 50 ms
        byte[] ping = frame(PortFrames.encode(Map.of("op", "ping")));
        client.write(ByteBuffer.wrap(ping));
        assertEquals("ping", r.next().get("op")); // there before the read
        // A reader whose spin is over at once blocks on the socket for a frame sent while it
        // reads, here in two pieces.
        PortFrames.Reader blocking = new PortFrames.Reader(accepted, 64, 1);
        java.util.concurrent.CompletableFuture<Map<String, Object>> next =
            java.util.concurrent.CompletableFuture.supplyAsync(() -> {
              try {
                return blocking.next();
              } catch (IOException | PortException e) {
                throw new java.util.concurrent.CompletionException(e);
              }
            });
        client.write(ByteBuffer.wrap(Arrays.copyOf(ping, 3)));
        client.write(ByteBuffer.wrap(ping, 3, ping.length - 3));
        assertEquals("ping", next.get(10, java.util.concurrent.TimeUnit.SECONDS).get("op"));
        assertTrue(accepted.isBlocking(), "left non-blocking: replies would be written so");
        client.write(ByteBuffer.wrap(ping));
        assertEquals("ping", r.next().get("op"));
        client.shutdownOutput();
        assertNull(r.next(), "a clean end seen while spinning");
      }
    } finally {
      java.nio.file.Files.deleteIfExists(dir.resolve("s"));
      java.nio.file.Files.delete(dir);
    }
  }

  @Test
  void anEndInsideAFrameOrABadLengthFails() throws Exception {
    byte[] whole = frame(PortFrames.encode(Map.of("op", "ping")));
    for (int cut = 1; cut < whole.length; cut++) {
      PortFrames.Reader r = new PortFrames.Reader(trickle(Arrays.copyOf(whole, cut), 2), 64);
      assertThrows(EOFException.class, r::next, "cut at " + cut);
    }
    PortFrames.Reader zero = new PortFrames.Reader(trickle(new byte[4], 4), 64);
    assertEquals(PortError.BAD_FRAME, assertThrows(PortException.class, zero::next).error());
    byte[] huge = ByteBuffer.allocate(4).putInt(PortFrames.MAX_FRAME_BYTES + 1).array();
    PortFrames.Reader over = new PortFrames.Reader(trickle(huge, 4), 64);
    assertEquals(PortError.BAD_FRAME, assertThrows(PortException.class, over::next).error());
  }
}
