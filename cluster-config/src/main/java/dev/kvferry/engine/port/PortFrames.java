package dev.kvferry.engine.port;

import java.io.EOFException;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.channels.ReadableByteChannel;
import java.nio.channels.WritableByteChannel;
import java.util.ArrayList;
import java.util.Collection;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import org.jspecify.annotations.Nullable;
import org.msgpack.core.MessageBufferPacker;
import org.msgpack.core.MessagePack;
import org.msgpack.core.MessagePackException;
import org.msgpack.core.MessageUnpacker;
import org.msgpack.value.Value;

/**
 * The port's framing: a 4-byte big-endian length, then one msgpack map. Values decode to plain
 * Java: {@code Map<String, Object>}, {@code List<Object>}, {@code Long}, {@code Double}, {@code
 * String}, {@code byte[]}, {@code Boolean} and null.
 */
final class PortFrames {

  static final int MAX_FRAME_BYTES = 64 << 20;

  private PortFrames() {}

  /**
   * Reads one frame.
   *
   * @return the frame's map, or null at a clean end of stream (between frames)
   * @throws PortException {@code bad_frame} for a bad length or bytes that are not one map
   * @throws IOException when the stream fails or ends inside a frame
   */
  static @Nullable Map<String, Object> read(ReadableByteChannel in)
      throws IOException, PortException {
    ByteBuffer header = ByteBuffer.allocate(4);
    if (!fill(in, header, true)) {
      return null;
    }
    int length = header.getInt(0);
    if (length <= 0 || length > MAX_FRAME_BYTES) {
      throw new PortException(PortError.BAD_FRAME,
          "frame length " + Integer.toUnsignedString(length) + " is outside 1.." + MAX_FRAME_BYTES);
    }
    ByteBuffer body = ByteBuffer.allocate(length);
    fill(in, body, false);
    return decodeMap(body.array());
  }

  static Map<String, Object> decodeMap(byte[] bytes) throws PortException {
    try (MessageUnpacker u = MessagePack.newDefaultUnpacker(bytes)) {
      Value v = u.unpackValue();
      if (u.hasNext()) {
        throw new PortException(PortError.BAD_FRAME, "a frame holds more than one msgpack value");
      }
      if (!v.isMapValue()) {
        throw new PortException(PortError.BAD_FRAME,
            "a frame must hold one msgpack map, got " + v.getValueType().name().toLowerCase());
      }
      @SuppressWarnings("unchecked")
      Map<String, Object> map = (Map<String, Object>) java.util.Objects.requireNonNull(toJava(v));
      return map;
    } catch (MessagePackException | IOException e) {
      throw new PortException(PortError.BAD_FRAME, "not msgpack: " + e.getMessage());
    }
  }

  private static boolean fill(ReadableByteChannel in, ByteBuffer buf, boolean endAllowed)
      throws IOException {
    while (buf.hasRemaining()) {
      if (in.read(buf) < 0) {
        if (endAllowed && buf.position() == 0) {
          return false;
        }
        throw new EOFException("stream ended inside a frame");
      }
    }
    return true;
  }

  private static @Nullable Object toJava(Value v) throws PortException {
    switch (v.getValueType()) {
      case NIL:
        return null;
      case BOOLEAN:
        return v.asBooleanValue().getBoolean();
      case INTEGER:
        if (!v.asIntegerValue().isInLongRange()) {
          throw new PortException(PortError.BAD_FRAME, "integer out of the 64-bit range");
        }
        return v.asIntegerValue().toLong();
      case FLOAT:
        return v.asFloatValue().toDouble();
      case STRING:
        return v.asStringValue().asString();
      case BINARY:
        return v.asBinaryValue().asByteArray();
      case ARRAY: {
        List<Object> list = new ArrayList<>();
        for (Value e : v.asArrayValue()) {
          list.add(toJava(e));
        }
        return list;
      }
      case MAP: {
        Map<String, Object> map = new LinkedHashMap<>();
        for (Map.Entry<Value, Value> e : v.asMapValue().entrySet()) {
          if (!e.getKey().isStringValue()) {
            throw new PortException(PortError.BAD_FRAME, "map keys must be strings");
          }
          map.put(e.getKey().asStringValue().asString(), toJava(e.getValue()));
        }
        return map;
      }
      default:
        throw new PortException(PortError.BAD_FRAME,
            "unsupported msgpack type " + v.getValueType());
    }
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
