package dev.kvferry.rdma;

import java.io.EOFException;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.channels.SocketChannel;
import java.nio.charset.StandardCharsets;
import org.jspecify.annotations.Nullable;

/**
 * The TCP data protocol, big-endian, shared by {@link TcpTransport} (client) and {@link
 * TcpListener} (server).
 *
 * <pre>
 * hello  (client first)  "KVFT" | version u8 = 1 | token length u8 (1..64) | token
 * frame  (client)        op u8 (1 WRITE, 2 READ) | region id i32 | count i32 (1..4096)
 *                        | count x (offset i64, length i64)
 *                        | WRITE only: the entries' bytes back to back
 * word   (client)        op u8 (3 DONE_WORD) | slot i32 | name length i32 (1..255)
 *                        | value i64 | the done-word file's name (ASCII)
 * ack    (listener)      status u8 (0 ok, 1 error) | message length u16 (..1024) | UTF-8 message
 * </pre>
 *
 * The listener answers the hello with an ack, each WRITE frame with an ack once its bytes have
 * landed, and each READ frame with an ack followed (when ok) by the entries' bytes. A DONE_WORD
 * frame stores the value into a word of one of the listener's own done-word files (a release
 * store, made only after every earlier frame of the connection was served, so behind their
 * bytes) and is answered with an ack; a name that is not one of its files is refused. A listener
 * older than op 3 refuses it as an unknown op: the peer then learns from its messages. After an
 * error ack the listener closes the connection. Entries are at most {@link #MAX_ENTRY_BYTES};
 * the client splits larger ones.
 */
final class TcpWire {
  static final int MAGIC = 0x4B564654; // "KVFT"
  static final int VERSION = 1;
  static final int MAX_TOKEN_BYTES = 64;
  static final byte OP_WRITE = 1;
  static final byte OP_READ = 2;
  static final byte OP_DONE_WORD = 3;
  /** Longest done-word file name a DONE_WORD frame may carry. */
  static final int MAX_DONE_WORD_NAME_BYTES = 255;
  static final int FRAME_HEADER_BYTES = 9;
  static final int ENTRY_BYTES = 16;
  static final int MAX_ENTRIES = 4096;
  static final long MAX_ENTRY_BYTES = 1L << 30;
  static final int MAX_MESSAGE_BYTES = 1024;
  static final int ACK_HEADER_BYTES = 3;
  static final byte ACK_OK = 0;
  static final byte ACK_ERROR = 1;

  private TcpWire() {}

  /** Progress of one connection, watched by {@link IoWatchdog}; updated on every syscall. */
  static final class Progress {
    volatile long busySinceNs; // 0 while idle between frames
    volatile long lastProgressNs;
    volatile boolean timedOut; // set by the watchdog before it closes the channel

    void busy() {
      long now = System.nanoTime();
      lastProgressNs = now;
      busySinceNs = now == 0 ? 1 : now;
    }

    void idle() {
      busySinceNs = 0;
    }

    void progressed() {
      lastProgressNs = System.nanoTime();
    }
  }

  /** The peer closed the connection in the middle of a message. */
  static final class TruncatedException extends EOFException {
    private static final long serialVersionUID = 1L;

    TruncatedException(String message) {
      super(message);
    }
  }

  /** Reads until {@code buf} is full (its limit is the message's end, position 0 its start). */
  static void readFully(SocketChannel ch, ByteBuffer buf, Progress progress, String what)
      throws IOException {
    while (buf.hasRemaining()) {
      if (ch.read(buf) < 0) {
        throw new TruncatedException(
            "truncated " + what + ": connection closed after " + buf.position() + " of "
                + buf.limit() + " bytes");
      }
      progress.progressed();
    }
  }

  static void writeFully(SocketChannel ch, ByteBuffer buf, Progress progress) throws IOException {
    while (buf.hasRemaining()) {
      ch.write(buf);
      progress.progressed();
    }
  }

  /** Writes an ack into {@code buf} (cleared, then flipped for writing). */
  static ByteBuffer ack(ByteBuffer buf, @Nullable String error) {
    buf.clear();
    if (error == null) {
      buf.put(ACK_OK).putShort((short) 0);
    } else {
      byte[] msg = error.getBytes(StandardCharsets.UTF_8);
      int n = Math.min(msg.length, MAX_MESSAGE_BYTES);
      buf.put(ACK_ERROR).putShort((short) n).put(msg, 0, n);
    }
    return buf.flip();
  }

  /**
   * Reads one ack.
   *
   * @return null for ok, else the listener's reason
   * @throws IOException when the bytes are no ack
   */
  static @Nullable String readAck(SocketChannel ch, ByteBuffer buf, Progress progress)
      throws IOException {
    buf.clear().limit(ACK_HEADER_BYTES);
    readFully(ch, buf, progress, "ack");
    byte status = buf.get(0);
    int length = buf.getShort(1) & 0xFFFF;
    if ((status != ACK_OK && status != ACK_ERROR) || length > MAX_MESSAGE_BYTES
        || (status == ACK_OK && length != 0)) {
      throw new IOException("garbage ack from peer (status " + status + ", length " + length + ")");
    }
    if (status == ACK_OK) {
      return null;
    }
    buf.clear().limit(length);
    readFully(ch, buf, progress, "ack message");
    buf.flip();
    String message = StandardCharsets.UTF_8.decode(buf).toString();
    return message.isEmpty() ? "(no reason given)" : message;
  }

  /**
   * Moves the bytes of entries {@code [0, count)} between the channel and a region with scattering
   * reads or gathering writes of up to {@link RegionSlots#SLOTS} entries per syscall, straight
   * into (or out of) the region's memory.
   */
  static void transferEntries(
      SocketChannel ch,
      RegionSlots slots,
      ByteBuffer[] iov,
      long[] offsets,
      long[] lengths,
      int count,
      boolean fromChannel,
      Progress progress)
      throws IOException {
    int i = 0;
    long done = 0; // bytes done inside entry i
    long total = 0;
    for (int e = 0; e < count; e++) {
      total += lengths[e];
    }
    long moved = 0;
    while (true) {
      while (i < count && lengths[i] == done) {
        i++;
        done = 0;
      }
      if (i == count) {
        return;
      }
      int k = 0;
      long skip = done;
      for (int j = i; j < count && k < iov.length; j++) {
        long length = lengths[j] - skip;
        if (length > 0) {
          iov[k] = slots.slot(k, offsets[j] + skip, (int) length);
          k++;
        }
        skip = 0;
      }
      long n = fromChannel ? ch.read(iov, 0, k) : ch.write(iov, 0, k);
      if (n < 0) {
        throw new TruncatedException(
            "truncated payload: connection closed after " + moved + " of " + total + " bytes");
      }
      progress.progressed();
      moved += n;
      while (n > 0) {
        long room = lengths[i] - done;
        if (n < room) {
          done += n;
          n = 0;
        } else {
          n -= room;
          i++;
          done = 0;
        }
      }
    }
  }
}
