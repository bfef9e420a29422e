package dev.kvferry.actors;

import java.io.NotSerializableException;
import java.nio.BufferOverflowException;
import java.nio.BufferUnderflowException;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.charset.StandardCharsets;
import org.apache.pekko.serialization.ByteBufferSerializer;
import org.apache.pekko.serialization.SerializerWithStringManifest;
import org.jspecify.annotations.Nullable;

/**
 * The peer messages sent once or more per transfer ({@link PeerProtocol.RemoteBlocks}, {@link
 * PeerProtocol.WriteDone}, {@link PeerProtocol.TransferFailed}, {@link PeerProtocol.Release}) in a
 * hand-written binary form, bound in this module's reference.conf; the handshake's messages stay
 * Jackson CBOR. Jackson's reflection and CBOR tokens cost the notify round trip more than the
 * bytes do, and Artery hands this serializer its own buffer, so nothing is copied on the way.
 *
 * <p>Layout, little-endian: strings are an int byte count then UTF-8; ints are 4 bytes; block ids
 * are an int count then one zigzag varint each (at most 5 bytes, the bound {@link
 * ClusterMessageLimit} assumes); the optional done word is a byte 0 (absent) or 1 then its
 * fields. The manifest names the message and its layout's version ({@code RB2}: RemoteBlocks,
 * version 2, which adds the sender's incarnation uid after the done word); a later layout takes a
 * new manifest, so a node reading an unknown one says so instead of misreading it. {@code RB1}
 * (no uid) is still read, as from a node of the version before. Bytes that do not parse
 * (truncated, lengths past the end, bytes left over) raise {@link NotSerializableException}
 * naming the message and the offset; Artery logs it and drops that message, and the node carries
 * on.
 */
public final class PeerMessageSerializer extends SerializerWithStringManifest
    implements ByteBufferSerializer {

  /** Unique among the serializers of a system (Pekko keeps 0 to 40 for its own). */
  public static final int IDENTIFIER = 1907;

  static final String REMOTE_BLOCKS = "RB2";
  /** RemoteBlocks without the sender's incarnation uid (the version before): still read. */
  static final String REMOTE_BLOCKS_V1 = "RB1";
  static final String WRITE_DONE = "WD1";
  static final String TRANSFER_FAILED = "TF1";
  static final String RELEASE = "RL1";

  @Override
  public int identifier() {
    return IDENTIFIER;
  }

  @Override
  public String manifest(Object o) {
    if (o instanceof PeerProtocol.RemoteBlocks) {
      return REMOTE_BLOCKS;
    } else if (o instanceof PeerProtocol.WriteDone) {
      return WRITE_DONE;
    } else if (o instanceof PeerProtocol.TransferFailed) {
      return TRANSFER_FAILED;
    } else if (o instanceof PeerProtocol.Release) {
      return RELEASE;
    }
    throw new IllegalArgumentException("PeerMessageSerializer does not handle "
        + o.getClass().getName() + "; bind it to another serializer in reference.conf");
  }

  @Override
  public byte[] toBinary(Object o) {
    // Sized exactly first: a message with a long block list or reason never overflows.
    ByteBuffer buf = ByteBuffer.allocate(sizeBytes(o));
    toBinary(o, buf);
    // A lone surrogate is sized as 3 bytes but written as '?' (1 byte).
    return buf.position() == buf.capacity() ? buf.array()
        : java.util.Arrays.copyOf(buf.array(), buf.position());
  }

  @Override
  public void toBinary(Object o, ByteBuffer buf) {
    ByteOrder callersOrder = buf.order();
    buf.order(ByteOrder.LITTLE_ENDIAN);
    try {
      write(o, buf);
    } finally {
      buf.order(callersOrder);
    }
  }

  @Override
  public Object fromBinary(byte[] bytes, String manifest) throws NotSerializableException {
    return fromBinary(ByteBuffer.wrap(bytes), manifest);
  }

  @Override
  public Object fromBinary(ByteBuffer buf, String manifest) throws NotSerializableException {
    ByteOrder callersOrder = buf.order();
    int start = buf.position();
    buf.order(ByteOrder.LITTLE_ENDIAN);
    try {
      Object message = read(buf, manifest);
      if (buf.hasRemaining()) {
        throw new NotSerializableException(what(manifest) + ": " + buf.remaining()
            + " bytes left over after the message (" + (buf.position() - start)
            + " bytes); the sender may run another kvferry version");
      }
      return message;
    } catch (BufferUnderflowException | MalformedException e) {
      String why = e instanceof MalformedException ? e.getMessage() : "ends early";
      throw new NotSerializableException(what(manifest) + ": " + why + " at byte "
          + (buf.position() - start) + " of " + (buf.limit() - start)
          + "; the message is dropped");
    } finally {
      buf.order(callersOrder);
    }
  }

  private static String what(String manifest) {
    return "kvferry peer message with manifest '" + manifest + "'";
  }

  private static void write(Object o, ByteBuffer buf) {
    try {
      if (o instanceof PeerProtocol.RemoteBlocks m) {
        putString(buf, m.transferId());
        putString(buf, m.requestId());
        putBlockIds(buf, m.blockIds());
        putString(buf, m.decodeEngineId());
        buf.putInt(m.decodeDpRank());
        buf.putInt(m.decodeTpRank());
        PeerProtocol.DoneWord w = m.doneWord();
        if (w == null) {
          buf.put((byte) 0);
        } else {
          buf.put((byte) 1);
          putString(buf, w.file());
          buf.putInt(w.slots());
          buf.putInt(w.slot());
          buf.putLong(w.value());
        }
        buf.putInt(m.decodeWorkerUid());
      } else if (o instanceof PeerProtocol.WriteDone m) {
        putString(buf, m.transferId());
        putString(buf, m.producerEngineId());
        buf.putInt(m.producerTpRank());
      } else if (o instanceof PeerProtocol.TransferFailed m) {
        putString(buf, m.transferId());
        putString(buf, m.engineId());
        putString(buf, m.reason());
        buf.putInt(m.senderTpRank());
      } else if (o instanceof PeerProtocol.Release m) {
        putString(buf, m.transferId());
        putString(buf, m.decodeEngineId());
        buf.putInt(m.decodeTpRank());
        buf.putInt(m.decodeTpSize());
      } else {
        throw new IllegalArgumentException("PeerMessageSerializer does not handle "
            + o.getClass().getName() + "; bind it to another serializer in reference.conf");
      }
    } catch (BufferOverflowException e) {
      // Artery's buffer is maximum-frame-size; ClusterMessageLimit refuses larger lists earlier.
      throw new IllegalArgumentException(o.getClass().getSimpleName() + " does not fit in the "
          + buf.capacity() + "-byte frame; raise pekko.remote.artery.advanced.maximum-frame-size",
          e);
    }
  }

  private static Object read(ByteBuffer buf, String manifest)
      throws NotSerializableException, MalformedException {
    switch (manifest) {
      case REMOTE_BLOCKS:
      case REMOTE_BLOCKS_V1: {
        String transferId = getString(buf);
        String requestId = getString(buf);
        int[] blockIds = getBlockIds(buf);
        String decodeEngineId = getString(buf);
        int decodeDpRank = buf.getInt();
        int decodeTpRank = buf.getInt();
        byte hasDoneWord = buf.get();
        PeerProtocol.@Nullable DoneWord doneWord;
        if (hasDoneWord == 0) {
          doneWord = null;
        } else if (hasDoneWord == 1) {
          doneWord = new PeerProtocol.DoneWord(getString(buf), buf.getInt(), buf.getInt(),
              buf.getLong());
        } else {
          buf.position(buf.position() - 1);
          throw new MalformedException("done-word flag is " + hasDoneWord + ", not 0 or 1");
        }
        int uid = manifest.equals(REMOTE_BLOCKS) ? buf.getInt() : 0;
        return new PeerProtocol.RemoteBlocks(transferId, requestId, blockIds, decodeEngineId,
            decodeDpRank, decodeTpRank, doneWord, uid);
      }
      case WRITE_DONE:
        return new PeerProtocol.WriteDone(getString(buf), getString(buf), buf.getInt());
      case TRANSFER_FAILED:
        return new PeerProtocol.TransferFailed(getString(buf), getString(buf), getString(buf),
            buf.getInt());
      case RELEASE:
        return new PeerProtocol.Release(getString(buf), getString(buf), buf.getInt(),
            buf.getInt());
      default:
        throw new NotSerializableException(what(manifest) + ": unknown to this node (it reads "
            + String.join(", ", REMOTE_BLOCKS, REMOTE_BLOCKS_V1, WRITE_DONE, TRANSFER_FAILED,
                RELEASE)
            + "); the sender may run another kvferry version; the message is dropped");
    }
  }

  /** The exact length {@link #toBinary(Object, ByteBuffer)} writes for {@code o}. */
  static int sizeBytes(Object o) {
    if (o instanceof PeerProtocol.RemoteBlocks m) {
      PeerProtocol.DoneWord w = m.doneWord();
      return stringBytes(m.transferId()) + stringBytes(m.requestId()) + blockIdsBytes(m.blockIds())
          + stringBytes(m.decodeEngineId()) + 8 + 1
          + (w == null ? 0 : stringBytes(w.file()) + 4 + 4 + 8) + 4;
    } else if (o instanceof PeerProtocol.WriteDone m) {
      return stringBytes(m.transferId()) + stringBytes(m.producerEngineId()) + 4;
    } else if (o instanceof PeerProtocol.TransferFailed m) {
      return stringBytes(m.transferId()) + stringBytes(m.engineId()) + stringBytes(m.reason()) + 4;
    } else if (o instanceof PeerProtocol.Release m) {
      return stringBytes(m.transferId()) + stringBytes(m.decodeEngineId()) + 8;
    }
    throw new IllegalArgumentException("PeerMessageSerializer does not handle "
        + o.getClass().getName() + "; bind it to another serializer in reference.conf");
  }

  private static int stringBytes(String s) {
    int bytes = 0;
    for (int i = 0; i < s.length(); i++) {
      char c = s.charAt(i);
      if (c < 0x80) {
        bytes += 1;
      } else if (c < 0x800) {
        bytes += 2;
      } else if (Character.isHighSurrogate(c) && i + 1 < s.length()
          && Character.isLowSurrogate(s.charAt(i + 1))) {
        bytes += 4;
        i++;
      } else {
        bytes += 3; // a lone surrogate is written as '?' (1 byte); 3 only over-allocates
      }
    }
    return 4 + bytes;
  }

  private static int blockIdsBytes(int[] ids) {
    int bytes = 4;
    for (int id : ids) {
      bytes += varintBytes(zigzag(id));
    }
    return bytes;
  }

  private static void putString(ByteBuffer buf, String s) {
    byte[] utf8 = s.getBytes(StandardCharsets.UTF_8);
    buf.putInt(utf8.length);
    buf.put(utf8);
  }

  private static String getString(ByteBuffer buf) throws MalformedException {
    int length = buf.getInt();
    if (length < 0 || length > buf.remaining()) {
      buf.position(buf.position() - 4);
      throw new MalformedException("a string of " + length + " bytes, with "
          + (buf.remaining() - 4) + " bytes left");
    }
    String s;
    if (buf.hasArray()) {
      s = new String(buf.array(), buf.arrayOffset() + buf.position(), length,
          StandardCharsets.UTF_8);
      buf.position(buf.position() + length);
    } else {
      byte[] utf8 = new byte[length];
      buf.get(utf8);
      s = new String(utf8, StandardCharsets.UTF_8);
    }
    return s;
  }

  private static void putBlockIds(ByteBuffer buf, int[] ids) {
    buf.putInt(ids.length);
    for (int id : ids) {
      int v = zigzag(id);
      while ((v & ~0x7F) != 0) {
        buf.put((byte) ((v & 0x7F) | 0x80));
        v >>>= 7;
      }
      buf.put((byte) v);
    }
  }

  private static int[] getBlockIds(ByteBuffer buf) throws MalformedException {
    int count = buf.getInt();
    // Every id takes at least one byte: a count past the bytes left is a lie, not an allocation.
    if (count < 0 || count > buf.remaining()) {
      buf.position(buf.position() - 4);
      throw new MalformedException("a list of " + count + " block ids, with "
          + (buf.remaining() - 4) + " bytes left");
    }
    int[] ids = new int[count];
    for (int i = 0; i < count; i++) {
      int v = 0;
      for (int shift = 0; ; shift += 7) {
        if (shift > 28) {
          throw new MalformedException("block id " + i + " is longer than 5 bytes");
        }
        byte b = buf.get();
        v |= (b & 0x7F) << shift;
        if (b >= 0) {
          break;
        }
      }
      ids[i] = (v >>> 1) ^ -(v & 1);
    }
    return ids;
  }

  private static int zigzag(int v) {
    return (v << 1) ^ (v >> 31);
  }

  private static int varintBytes(int v) {
    int bytes = 1;
    while ((v & ~0x7F) != 0) {
      bytes++;
      v >>>= 7;
    }
    return bytes;
  }

  /** Bytes that do not parse as the manifest's layout; turned into NotSerializableException. */
  private static final class MalformedException extends Exception {
    private static final long serialVersionUID = 1L;

    MalformedException(String message) {
      super(message, null, false, false);
    }
  }
}
