package dev.kvferry.engine.port;

import java.io.EOFException;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.charset.CharacterCodingException;
import java.nio.charset.StandardCharsets;
import java.nio.channels.ReadableByteChannel;
import java.nio.channels.SocketChannel;
import java.nio.channels.WritableByteChannel;
import java.util.ArrayList;
import java.util.Collection;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import org.jspecify.annotations.Nullable;
import org.msgpack.core.MessageBufferPacker;
import org.msgpack.core.MessagePack;
import org.msgpack.core.MessagePackException;
import org.msgpack.core.MessageUnpacker;
import org.msgpack.core.MessageIntegerOverflowException;
import org.msgpack.value.ValueType;

/**
 * The port's framing: a 4-byte big-endian length, then one msgpack map. Values decode to plain
 * Java: {@code Map<String, Object>}, {@code List<Object>}, {@code Long}, {@code Double}, {@code
 * String}, {@code byte[]}, {@code Boolean} and null.
 */
final class PortFrames {

  static final int MAX_FRAME_BYTES = 64 << 20;
  /** Most arrays and maps a frame may nest, its own map included (the protocol's use 3). */
  static final int MAX_DEPTH = 32;

  private PortFrames() {}

  /**
   * Reads frames through one buffer, so frames a client sends together (its one-way ops, held
   * until its next request) cost one system call between them rather than two each.
   */
  static final class Reader {

    private final ReadableByteChannel in;
    /** Bytes read and not yet consumed lie between position and limit. */
    private final ByteBuffer buffer;
    /** How long a read that finds nothing polls before it blocks; 0: it blocks at once. */
    private final long spinNanos;

    Reader(ReadableByteChannel in, int capacity) {
      this(in, capacity, 0);
    }

    /**
     * @param spinNanos with a {@link SocketChannel}, how long to poll for the next bytes before
     *     blocking on the socket: the engine's next call after a reply often comes within
     *     microseconds, and a thread that blocked pays a wake-up (on a virtual machine's idle CPU,
     *     50-200 us) before it can answer
     */
    Reader(ReadableByteChannel in, int capacity, long spinNanos) {
      this.in = in;
      this.buffer = ByteBuffer.allocate(capacity);
      this.spinNanos = spinNanos;
      buffer.flip();
    }

    /**
     * The next frame's map.
     *
     * @return null at a clean end of stream (between frames)
     * @throws PortException {@code bad_frame} for a bad length or bytes that are not one map
     * @throws IOException when the stream fails or ends inside a frame
     */
    @Nullable Map<String, Object> next() throws IOException, PortException {
      if (!buffered(4)) {
        return null;
      }
      int length = buffer.getInt();
      checkLength(length);
      byte[] body = new byte[length];
      int have = Math.min(buffer.remaining(), length);
      buffer.get(body, 0, have);
      if (have < length) { // a frame larger than what is buffered: the rest straight from the stream
        fill(in, ByteBuffer.wrap(body, have, length - have));
      }
      return decodeMap(body);
    }

    /** False when the stream ended cleanly with nothing buffered. */
    private boolean buffered(int bytes) throws IOException {
      while (buffer.remaining() < bytes) {
        buffer.compact();
        int read = spinNanos > 0 && in instanceof SocketChannel ch ? spinRead(ch) : in.read(buffer);
        buffer.flip();
        if (read < 0) {
          if (!buffer.hasRemaining()) {
            return false;
          }
          throw new EOFException("stream ended inside a frame");
        }
      }
      return true;
    }

    /** Reads what comes within {@link #spinNanos} without blocking, else blocks for it. */
    private int spinRead(SocketChannel ch) throws IOException {
      ch.configureBlocking(false);
      int read;
      try {
        long end = System.nanoTime() + spinNanos;
        do {
          read = ch.read(buffer);
          if (read != 0) {
            break;
          }
          Thread.onSpinWait();
        } while (System.nanoTime() - end < 0);
      } catch (IOException e) {
        // The read's failure is the news (a closed or reset channel); restoring blocking mode
        // on such a channel throws too, and must not hide it.
        try {
          ch.configureBlocking(true);
        } catch (IOException alsoClosed) {
          e.addSuppressed(alsoClosed);
        }
        throw e;
      }
      ch.configureBlocking(true); // replies are written blocking, by this same thread
      return read != 0 ? read : ch.read(buffer);
    }
  }

  private static void checkLength(int length) throws PortException {
    if (length <= 0 || length > MAX_FRAME_BYTES) {
      throw new PortException(PortError.BAD_FRAME,
          "frame length " + Integer.toUnsignedString(length) + " is outside 1.." + MAX_FRAME_BYTES);
    }
  }

  static Map<String, Object> decodeMap(byte[] bytes) throws PortException {
    try (MessageUnpacker u = MessagePack.newDefaultUnpacker(bytes)) {
      ValueType type = u.getNextFormat().getValueType();
      if (type != ValueType.MAP) {
        throw new PortException(PortError.BAD_FRAME,
            "a frame must hold one msgpack map, got " + type.name().toLowerCase(Locale.ROOT));
      }
      @SuppressWarnings("unchecked")
      Map<String, Object> map =
          (Map<String, Object>) java.util.Objects.requireNonNull(next(u, 0, bytes.length));
      if (u.hasNext()) {
        throw new PortException(PortError.BAD_FRAME, "a frame holds more than one msgpack value");
      }
      return map;
    } catch (MessageIntegerOverflowException e) {
      throw new PortException(PortError.BAD_FRAME, "integer out of the 64-bit range");
    } catch (MessagePackException | IOException e) {
      throw new PortException(PortError.BAD_FRAME, "not msgpack: " + e.getMessage());
    }
  }

  private static void fill(ReadableByteChannel in, ByteBuffer buf) throws IOException {
    while (buf.hasRemaining()) {
      if (in.read(buf) < 0) {
        throw new EOFException("stream ended inside a frame");
      }
    }
  }

  /**
   * The next value, decoded straight from the stream (no msgpack {@code Value} tree in between:
   * the node decodes hundreds of a step's frames). Nesting deeper than {@link #MAX_DEPTH} is
   * refused rather than recursed into.
   */
  private static @Nullable Object next(MessageUnpacker u, int depth, long frameBytes)
      throws IOException, PortException {
    if (depth > MAX_DEPTH) {
      throw new PortException(PortError.BAD_FRAME,
          "values nested deeper than " + MAX_DEPTH + " levels");
    }
    ValueType type = u.getNextFormat().getValueType();
    switch (type) {
      case NIL:
        u.unpackNil();
        return null;
      case BOOLEAN:
        return u.unpackBoolean();
      case INTEGER:
        return u.unpackLong();
      case FLOAT:
        return u.unpackDouble();
      case STRING:
        return string(payload(u, u.unpackRawStringHeader(), frameBytes));
      case BINARY:
        return payload(u, u.unpackBinaryHeader(), frameBytes);
      case ARRAY: {
        int n = u.unpackArrayHeader();
        List<Object> list = new ArrayList<>(Math.min(n, 1024)); // the header is not trusted
        for (int k = 0; k < n; k++) {
          list.add(next(u, depth + 1, frameBytes));
        }
        return list;
      }
      case MAP: {
        int n = u.unpackMapHeader();
        Map<String, Object> map = new LinkedHashMap<>();
        for (int k = 0; k < n; k++) {
          if (u.getNextFormat().getValueType() != ValueType.STRING) {
            throw new PortException(PortError.BAD_FRAME, "map keys must be strings");
          }
          String key = string(payload(u, u.unpackRawStringHeader(), frameBytes));
          map.put(key, next(u, depth + 1, frameBytes));
        }
        return map;
      }
      default:
        throw new PortException(PortError.BAD_FRAME, "unsupported msgpack type " + type);
    }
  }

  /**
   * A string's or binary's bytes. Its header is not trusted: msgpack allocates the length it
   * claims before reading, so a header claiming more than is left of the frame is refused (a
   * frame of 8 bytes could otherwise have it allocate 2 GiB).
   */
  private static byte[] payload(MessageUnpacker u, int length, long frameBytes)
      throws IOException, PortException {
    if (length < 0 || length > frameBytes - u.getTotalReadBytes()) {
      throw new PortException(PortError.BAD_FRAME, "a value claims "
          + Integer.toUnsignedString(length) + " bytes, more than is left of the frame");
    }
    return u.readPayload(length);
  }

  /** UTF-8, strictly: bytes that are not UTF-8 are a bad frame, not replacement characters. */
  private static String string(byte[] utf8) throws PortException {
    for (byte b : utf8) {
      if (b < 0) {
        try {
          return StandardCharsets.UTF_8.newDecoder().decode(ByteBuffer.wrap(utf8)).toString();
        } catch (CharacterCodingException e) {
          throw new PortException(PortError.BAD_FRAME, "a string is not UTF-8");
        }
      }
    }
    return new String(utf8, StandardCharsets.US_ASCII);
  }

  /** Writes one frame holding {@code map}. */
  static void write(WritableByteChannel out, Map<String, ?> map) throws IOException {
    byte[] body = encode(map);
    ByteBuffer frame = ByteBuffer.allocate(4 + body.length);
    frame.putInt(body.length).put(body).flip();
    while (frame.hasRemaining()) {
      out.write(frame);
    }
  }

  static byte[] encode(Map<String, ?> map) throws IOException {
    try (MessageBufferPacker p = MessagePack.newDefaultBufferPacker()) {
      pack(p, map);
      return p.toByteArray();
    }
  }

  private static void pack(MessageBufferPacker p, @Nullable Object v) throws IOException {
    if (v == null) {
      p.packNil();
    } else if (v instanceof Boolean b) {
      p.packBoolean(b);
    } else if (v instanceof Integer i) {
      p.packInt(i);
    } else if (v instanceof Long l) {
      p.packLong(l);
    } else if (v instanceof Double d) {
      p.packDouble(d);
    } else if (v instanceof String s) {
      p.packString(s);
    } else if (v instanceof byte[] b) {
      p.packBinaryHeader(b.length);
      p.writePayload(b);
    } else if (v instanceof int[] a) {
      p.packArrayHeader(a.length);
      for (int x : a) {
        p.packInt(x);
      }
    } else if (v instanceof Map<?, ?> m) {
      p.packMapHeader(m.size());
      for (Map.Entry<?, ?> e : m.entrySet()) {
        p.packString(String.valueOf(e.getKey()));
        pack(p, e.getValue());
      }
    } else if (v instanceof Collection<?> c) {
      p.packArrayHeader(c.size());
      for (Object e : c) {
        pack(p, e);
      }
    } else {
      throw new IllegalArgumentException("cannot encode " + v.getClass().getName());
    }
  }
}
