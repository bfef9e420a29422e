package dev.kvferry.rdma.cuda;

import com.sun.jna.Native;
import com.sun.jna.Pointer;
import dev.kvferry.rdma.Futex;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.lang.invoke.MethodHandles;
import java.lang.invoke.VarHandle;
import java.nio.ByteOrder;
import java.nio.MappedByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;

/**
 * 64-bit "done" words in host shared memory (a file under {@code /dev/shm}) that a GPU stream of
 * one process writes and a CPU of another process reads with a plain load: how D learns that P's
 * copies into its GPU memory have landed with no message between them. The owner (D) creates the
 * file and spins on {@link #get}; the writer (P) opens it, which page-locks and maps it for every
 * GPU ({@link Cuda#hostRegisterMapped}), and queues {@code cuStreamWriteValue64} to {@link
 * #deviceAddress} after its copies (the store flushes their writes first). Values only grow: a
 * reader waits for {@code get(slot) >= sequence}, so a word is reused without resetting it.
 *
 * <p>Host transports store the word with the CPU instead ({@link #store}: a release store, then a
 * ring of the file's bell, a 32-bit counter after the words, which wakes the reader sleeping on it
 * in {@link #awaitBell}, a futex; the reader needs neither to spin nor to poll for words stored
 * that way): a cma writer maps D's file itself ({@link #openPeerWordsForCpu}); over tcp D's
 * listener stores into D's own mapping when the word's frame arrives behind the data.
 */
public final class SharedDoneWords implements AutoCloseable {

  private static final VarHandle LONGS =
      MethodHandles.byteBufferViewVarHandle(long[].class, ByteOrder.nativeOrder());
  private static final VarHandle INTS =
      MethodHandles.byteBufferViewVarHandle(int[].class, ByteOrder.nativeOrder());
  private static final int PAGE_BYTES = 4096;

  /** Where D keeps its done words; a peer's words are opened nowhere else. */
  public static final Path PEER_DIR = Path.of("/dev/shm");
  /** The names kvferry gives done-word files; a peer's words are opened under no other name. */
  private static final java.util.regex.Pattern PEER_NAME =
      java.util.regex.Pattern.compile("kvferry-done-[A-Za-z0-9_-][A-Za-z0-9._-]{0,159}");
  /** The most words a peer's file may hold (D uses 4096). */
  public static final int MAX_PEER_SLOTS = 1 << 16;

  private final Path path;
  private final boolean owner;
  private final int slots;
  private final MappedByteBuffer buffer;
  private final long hostAddress;
  private long deviceAddress;

  private SharedDoneWords(Path path, boolean owner, int slots) {
    this.path = path;
    this.owner = owner;
    this.slots = slots;
    long bytes = fileBytes(slots);
    try (FileChannel ch = owner
        ? FileChannel.open(path, StandardOpenOption.CREATE_NEW, StandardOpenOption.READ,
            StandardOpenOption.WRITE)
        : FileChannel.open(path, StandardOpenOption.READ, StandardOpenOption.WRITE,
            java.nio.file.LinkOption.NOFOLLOW_LINKS)) {
      if (owner) {
        ch.truncate(bytes);
        ch.write(java.nio.ByteBuffer.allocate(1), bytes - 1); // size the file, zero-filled
      } else if (ch.size() < fileBytes(slots)) {
        throw new IllegalArgumentException(
            path + " holds " + ch.size() + " bytes, too few for " + slots + " done words");
      }
      buffer = ch.map(FileChannel.MapMode.READ_WRITE, 0, bytes);
    } catch (IOException e) {
      throw new UncheckedIOException("cannot map done words " + path + ": " + e.getMessage(), e);
    }
    hostAddress = Pointer.nativeValue(Native.getDirectBufferPointer(buffer));
  }

  /** D: new zeroed words in a fresh file under {@code dir} (use {@code /dev/shm}). */
  public static SharedDoneWords create(Path dir, String name, int slots) {
    return new SharedDoneWords(dir.resolve(name), true, slots);
  }

  /**
   * P: the words D named in its remote blocks, mapped here and made writable from every GPU. The
   * name comes off the wire, so it is checked first ({@link #checkedPeerFile}): P maps and stores
   * into nothing but a kvferry done-word file of D's under {@link #PEER_DIR}.
   *
   * @throws IllegalArgumentException naming what is wrong with the name or the file
   */
  public static SharedDoneWords openPeerWords(String name, int slots) {
    return openForGpuWrites(checkedPeerFile(PEER_DIR, name, slots), slots);
  }

  /**
   * P over a host transport (cma): the words D named, mapped here for CPU stores ({@link #set}).
   * The name is checked as for {@link #openPeerWords}; no GPU is touched.
   *
   * @throws IllegalArgumentException naming what is wrong with the name or the file
   */
  public static SharedDoneWords openPeerWordsForCpu(String name, int slots) {
    return new SharedDoneWords(checkedPeerFile(PEER_DIR, name, slots), false, slots);
  }

  /**
   * Checks a done-word name and size a peer sent without looking for the file (it may live on
   * another host): a bare name of kvferry's pattern and a slot count within bounds.
   *
   * @throws IllegalArgumentException naming what is wrong
   */
  public static void checkPeerName(String name, int slots) {
    if (name == null || !PEER_NAME.matcher(name).matches() || name.contains("..")) {
      throw new IllegalArgumentException(
          "done words named '" + name + "' by the peer are not a kvferry done-word file; refused");
    }
    if (slots < 1 || slots > MAX_PEER_SLOTS) {
      throw new IllegalArgumentException(
          "done words " + name + ": " + slots + " slots named by the peer; at most "
              + MAX_PEER_SLOTS);
    }
  }

  /**
   * The done-word file a peer named, if it may be opened: a bare name of kvferry's pattern (no
   * directory), under {@code dir}, a regular file (not a link) of exactly the size {@code slots}
   * words take, owned by this process's user.
   */
  public static Path checkedPeerFile(Path dir, String name, int slots) {
    checkPeerName(name, slots);
    Path path = dir.resolve(name);
    java.nio.file.attribute.BasicFileAttributes a;
    try {
      a = Files.readAttributes(path, java.nio.file.attribute.BasicFileAttributes.class,
          java.nio.file.LinkOption.NOFOLLOW_LINKS);
    } catch (IOException e) {
      throw new IllegalArgumentException("done words " + path + ": " + e.getMessage(), e);
    }
    if (!a.isRegularFile()) {
      throw new IllegalArgumentException(
          "done words " + path + " is not a regular file (a link?); refused");
    }
    long want = fileBytes(slots);
    if (a.size() != want) {
      throw new IllegalArgumentException(
          "done words " + path + " has " + a.size() + " bytes; " + slots + " words take " + want
              + "; refused");
    }
    try {
      Object fileUid = Files.getAttribute(path, "unix:uid", java.nio.file.LinkOption.NOFOLLOW_LINKS);
      Object ownUid = Files.getAttribute(Path.of("/proc/self"), "unix:uid");
      if (!fileUid.equals(ownUid)) {
        throw new IllegalArgumentException(
            "done words " + path + " belong to uid " + fileUid + ", not to this process's "
                + ownUid + "; refused");
      }
    } catch (IOException | UnsupportedOperationException e) {
      // no unix attributes or no /proc here: the name, place, type and size checks stand
    }
    return path;
  }

  /**
   * The owner's words at a path this program chose itself (benchmarks), mapped here and made
   * writable from every GPU. A path from a peer goes through {@link #openPeerWords}.
   */
  public static SharedDoneWords openForGpuWrites(Path path, int slots) {
    SharedDoneWords w = new SharedDoneWords(path, false, slots);
    w.deviceAddress = Cuda.hostRegisterMapped(w.hostAddress, w.buffer.capacity());
    return w;
  }

  public Path path() {
    return path;
  }

  /** The file's bare name, as D hands it to P. */
  public String name() {
    return path.getFileName().toString();
  }

  /**
   * The value P stores, as a hint, once a transfer's layer has landed with {@code layersBehind}
   * (1 for the layer it writes last) still to come: below the done value, so it completes
   * nothing, and above what the slot held before (a transfer has far fewer layers than a file
   * has slots). Where the GPU stores the words D polls them; a hint tells it when to look hard.
   */
  public static long progressValue(long doneValue, int layersBehind) {
    if (layersBehind < 1) {
      throw new IllegalArgumentException("a hint is for a layer before the last: " + layersBehind);
    }
    return doneValue - layersBehind;
  }

  /**
   * Whether {@code word}, read from the slot of a transfer whose done value is {@code doneValue},
   * is a hint that at most {@code withinLayers} of its layers are still to land. Not done ({@code
   * word >= doneValue}) and not a previous transfer's word (at least a file's worth of values
   * lower) nor a fresh file's zero.
   */
  public static boolean nearlyDone(long word, long doneValue, int withinLayers) {
    return word > 0 && word < doneValue && doneValue - word <= withinLayers;
  }

  /** How many words the file holds. */
  public int slots() {
    return slots;
  }

  /** The word's current value (an acquire load: what the GPU flushed before it is visible). */
  public long get(int slot) {
    return (long) LONGS.getAcquire(buffer, index(slot));
  }

  /**
   * Stores {@code value} into the word with the CPU, a release store: every write this thread
   * (or one it synchronised with) made before is visible to a reader that sees the value.
   *
   * @throws IndexOutOfBoundsException for a slot outside the file
   */
  public void set(int slot, long value) {
    LONGS.setRelease(buffer, index(slot), value);
  }

  /**
   * A host transport's store: {@link #set} then {@link #ring}, so a reader asleep on the bell
   * wakes. Every CPU store a transport makes for its peer goes through here.
   */
  public void store(int slot, long value) {
    set(slot, value);
    ring();
  }

  /**
   * Bumps the bell's counter and wakes the reader if it sleeps in {@link #awaitBell}. A system
   * call, once per transfer.
   */
  public void ring() {
    INTS.getAndAdd(buffer, bellIndex(), 1);
    Futex.wake(hostAddress + bellIndex());
  }

  /** The bell's count now; read it before looking at the words, then {@link #awaitBell} it. */
  public int bell() {
    return (int) INTS.getAcquire(buffer, bellIndex());
  }

  /**
   * Sleeps until the bell is rung past {@code seen} (at once if it already was), at most {@code
   * timeoutNanos}; may return early. Needs {@link Futex#available()}: without it a reader polls.
   */
  public void awaitBell(int seen, long timeoutNanos) {
    Futex.await(hostAddress + bellIndex(), seen, timeoutNanos);
  }

  /** Spins until the word reaches {@code value} or {@code timeoutNs} passes; the time seen, or -1. */
  public long awaitAtLeast(int slot, long value, long timeoutNs) {
    long start = System.nanoTime();
    while (true) {
      long now = System.nanoTime();
      if (get(slot) >= value) {
        return now;
      }
      if (now - start > timeoutNs) {
        return -1;
      }
      Thread.onSpinWait();
    }
  }

  /** Where a GPU stream of the writer stores to {@code slot} (writer side only). */
  public long deviceAddress(int slot) {
    if (deviceAddress == 0) {
      throw new IllegalStateException("done words " + path + " were not opened for GPU writes");
    }
    return deviceAddress + index(slot);
  }

  private int index(int slot) {
    if (slot < 0 || slot >= slots) {
      throw new IndexOutOfBoundsException("done word " + slot + " of " + slots);
    }
    return slot * 8;
  }

  /** The bell: the 32-bit word right after the done words. */
  private int bellIndex() {
    return slots * 8;
  }

  /** The file: the words and the bell, in whole pages. */
  private static long fileBytes(int slots) {
    return roundToPage(8L * slots + Long.BYTES);
  }

  private static long roundToPage(long bytes) {
    return (bytes + PAGE_BYTES - 1) / PAGE_BYTES * PAGE_BYTES;
  }

  /** Unregisters (writer) or deletes the file (owner); the mapping goes with the buffer. */
  @Override
  public void close() {
    if (deviceAddress != 0) {
      Cuda.hostUnregister(hostAddress);
      deviceAddress = 0;
    }
    if (owner) {
      try {
        Files.deleteIfExists(path);
      } catch (IOException e) {
        // a leftover page in /dev/shm is harmless
      }
    }
  }
}
