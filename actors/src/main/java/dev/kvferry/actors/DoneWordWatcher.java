package dev.kvferry.actors;

import dev.kvferry.rdma.cuda.SharedDoneWords;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ThreadLocalRandom;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.locks.LockSupport;
import java.util.function.Consumer;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;
import org.jspecify.annotations.Nullable;

/**
 * D, WRITE mode: learns that P's writes of a transfer have landed from a done word stored right
 * behind them ({@link SharedDoneWords}; cuda: P's copy stream stores it; cma: P stores it into its
 * own mapping of this file once its writes returned; tcp: this process's listener stores it when
 * P's word frame arrives behind the data), instead of waiting for P to send WriteDone (hundreds
 * of microseconds to milliseconds through two actor systems). The WriteDone message still comes and
 * still completes the transfer when the word is not used or not seen (a slot reused under it, P
 * unable to map the words): the word only makes D learn sooner, never the only way.
 *
 * <p>One thread reads the words of the transfers in flight, and sleeps when nothing is in
 * flight. Where every word is stored by a CPU that rings the file's bell behind it (cma, tcp:
 * {@link dev.kvferry.rdma.Transport#ringsDoneWordBell}) it sleeps on the bell between looks (a
 * futex; a long timeout as a safety net) and costs no CPU while it waits. Where a GPU stream
 * stores the word it polls: spinning while P's hint says a transfer's last layer is on its way
 * ({@link SharedDoneWords#progressValue}), otherwise in short parks with a timer slack of their
 * own scale.
 */
final class DoneWordWatcher implements AutoCloseable {
  private static final Logger log = LoggerFactory.getLogger(DoneWordWatcher.class);
  static final int SLOTS = 4096;
  /**
   * How long the watcher spins after news before it parks ({@code -Dkvferry.done-words.spin-us}).
   * 0 since P hints when a transfer's last layer is on its way: with the hints, 2 ms of spin after
   * each word gave the same tail on an H200 (86.1 / 87.2 us against 88.4 / 87.8 us without) for
   * 28% of a core against 17-18% (gpu.md).
   */
  private static final long SPIN_NS =
      TimeUnit.MICROSECONDS.toNanos(Long.getLong("kvferry.done-words.spin-us", 0));
  /** How long each park lasts once the spin is over ({@code -Dkvferry.done-words.park-us}). */
  private static final long PARK_NS =
      TimeUnit.MICROSECONDS.toNanos(Long.getLong("kvferry.done-words.park-us", 20));
  /**
   * The polling thread's timer slack ({@code -Dkvferry.done-words.timer-slack-ns}; 0 keeps the
   * kernel's). The kernel's 50 us stretched each 20 us park to about 70 us, so a word landed
   * some 35 us before D saw it, on average; with 1 us the last layer's event to D done fell from
   * 1.23x one layer's write to 0.87-0.92x on an H200, for 24-26% of a core against 17% (gpu.md).
   */
  private static final long SLACK_NS = Long.getLong("kvferry.done-words.timer-slack-ns", 1000);
  /**
   * Longest spin on one transfer's hint that it is near its end: a P that died there, or a last
   * layer whose compute is slow, costs parks again after this.
   */
  private static final long NEAR_SPIN_NS = TimeUnit.MILLISECONDS.toNanos(20);
  /**
   * Longest sleep on the bell: a word stored without a ring (a P that does not ring) is still
   * seen this soon, and the WriteDone message would end the transfer anyway.
   */
  private static final long BELL_WAIT_NS = TimeUnit.MILLISECONDS.toNanos(1);

  /**
   * What D puts in its RemoteBlocks so P can store the word: the file's bare name (P opens it
   * only under {@link SharedDoneWords#PEER_DIR}), never a path.
   */
  record Ticket(String name, int slots, int slot, long value) {}

  /**
   * Most words one transfer may take: one per P worker that writes into this D worker (P's TP
   * size over D's); beyond it the transfer waits for messages.
   */
  static final int MAX_PARTS = 64;

  /**
   * A watched transfer: one word per P worker writing it, each with its own slot and value; it
   * is done once every word holds its value. {@code nearSince} is the watcher thread's own (0: no
   * near hint yet).
   */
  private static final class Pending {
    final String transferId;
    final int[] slots;
    final long[] values;
    long nearSince;

    Pending(String transferId, int[] slots, long[] values) {
      this.transferId = transferId;
      this.slots = slots;
      this.values = values;
    }

    /** Whether every writer's word holds its value. */
    boolean landed(SharedDoneWords words) {
      for (int i = 0; i < slots.length; i++) {
        if (words.get(slots[i]) < values[i]) {
          return false;
        }
      }
      return true;
    }

    /**
     * Whether every writer's word says at most {@link LayerWriter#NEAR_LAYERS} layers are still
     * to land, or holds its value (P's hints): only then is a spin worth it.
     */
    boolean near(SharedDoneWords words) {
      for (int i = 0; i < slots.length; i++) {
        long word = words.get(slots[i]);
        if (word < values[i]
            && !SharedDoneWords.nearlyDone(word, values[i], LayerWriter.NEAR_LAYERS)) {
          return false;
        }
      }
      return true;
    }
  }

  private final SharedDoneWords words;
  /** Whether the words' stores ring the bell: sleep on it instead of spinning and polling. */
  private final boolean belled;
  private final Consumer<String> onDone;
  private final Map<String, Pending> pending = new ConcurrentHashMap<>();
  private final Pending[] bySlot = new Pending[SLOTS];
  /**
   * What the watcher thread polls: a copy of {@code pending}'s values, rebuilt when it changes (a
   * few times per transfer), so the spinning loop allocates nothing (an iterator over the map per
   * pass came to hundreds of KiB per transfer). An entry no longer in {@code pending} is skipped.
   */
  private volatile Pending[] watching = new Pending[0];
  private final Thread thread;
  /** The last value handed out; from a file's worth up, so every hint below a value is positive. */
  private long sequence = SLOTS;
  private volatile boolean running = true;
  /** How many transfers a hint showed near their end (tests). */
  private volatile long nearHints;

  private DoneWordWatcher(
      SharedDoneWords words, String label, boolean belled, Consumer<String> onDone) {
    this.words = words;
    // Without futexes the bell could only be polled at its timeout: poll the words instead.
    this.belled = belled && dev.kvferry.rdma.Futex.available();
    this.onDone = onDone;
    this.thread = new Thread(this::run, "kvferry-done-words-" + label);
    thread.setDaemon(true);
    thread.start();
  }

  /**
   * A watcher with fresh words under /dev/shm, or null where there is none (then: messages).
   *
   * @param belled whether every store into the words rings their bell (the transport's {@link
   *     dev.kvferry.rdma.Transport#ringsDoneWordBell})
   */
  static @Nullable DoneWordWatcher tryCreate(
      String label, boolean belled, Consumer<String> onDone) {
    Path dir = SharedDoneWords.PEER_DIR;
    if (!Files.isDirectory(dir) || !Files.isWritable(dir)) {
      return null;
    }
    sweepStale(dir);
    String name = "kvferry-done-" + label.replaceAll("[^A-Za-z0-9._-]", "_") + "-"
        + ProcessHandle.current().pid() + "-" + Long.toHexString(ThreadLocalRandom.current().nextLong());
    try {
      return new DoneWordWatcher(
          SharedDoneWords.create(dir, name, SLOTS), label, belled, onDone);
    } catch (RuntimeException e) {
      log.info("done words unavailable for {} ({}); D learns of writes from messages only", label,
          e.getMessage());
      return null;
    }
  }

  /**
   * Deletes done-word files of processes that are gone (a killed D cannot delete its own): names
   * end in "-PID-HEX"; files of live processes are left alone. Returns how many were deleted.
   */
  static int sweepStale(Path dir) {
    int deleted = 0;
    try (java.nio.file.DirectoryStream<Path> files =
        Files.newDirectoryStream(dir, "kvferry-done-*")) {
      for (Path f : files) {
        String[] parts = f.getFileName().toString().split("-");
        if (parts.length < 5) {
          continue;
        }
        long pid;
        try {
          pid = Long.parseLong(parts[parts.length - 2]);
        } catch (NumberFormatException e) {
          continue;
        }
        if (pid > 0 && ProcessHandle.of(pid).isEmpty()
            && Files.isRegularFile(f, java.nio.file.LinkOption.NOFOLLOW_LINKS)) {
          try {
            Files.deleteIfExists(f);
            deleted++;
          } catch (java.io.IOException | SecurityException e) {
            // another user's file, or gone already: not ours to clean
          }
        }
      }
    } catch (java.io.IOException | RuntimeException e) {
      log.debug("could not sweep stale done words in {}: {}", dir, e.toString());
    }
    return deleted;
  }

  /**
   * Watches {@code parts} words for {@code transferId}, one per P worker writing it (each stores
   * its {@link Ticket#value} in its own slot); reported once all of them hold their values.
   *
   * @throws IllegalArgumentException unless 1 <= parts <= {@link #MAX_PARTS}
   */
  Ticket[] register(String transferId, int parts) {
    if (parts < 1 || parts > MAX_PARTS) {
      throw new IllegalArgumentException(
          "a transfer takes 1 to " + MAX_PARTS + " done words, not " + parts);
    }
    int[] slots = new int[parts];
    long[] values = new long[parts];
    synchronized (this) {
      for (int i = 0; i < parts; i++) {
        values[i] = ++sequence;
        slots[i] = (int) (values[i] % SLOTS);
        // A transfer still pending on this slot 4096 words later would see the new value:
        // it goes back to waiting for its WriteDone messages instead.
        Pending stale = bySlot[slots[i]];
        if (stale != null) {
          pending.remove(stale.transferId, stale);
        }
      }
      Pending p = new Pending(transferId, slots, values);
      for (int slot : slots) {
        bySlot[slot] = p;
      }
      pending.put(transferId, p);
      rebuildWatching();
    }
    LockSupport.unpark(thread);
    String name = words.path().getFileName().toString();
    Ticket[] tickets = new Ticket[parts];
    for (int i = 0; i < parts; i++) {
      tickets[i] = new Ticket(name, SLOTS, slots[i], values[i]);
    }
    return tickets;
  }

  /** How many transfers a hint showed near their end (tests). */
  long nearHints() {
    return nearHints;
  }

  /** The words this watcher reads (a transport that stores in band must know them). */
  SharedDoneWords words() {
    return words;
  }

  /** Stops watching (the transfer ended another way). */
  void forget(String transferId) {
    if (pending.remove(transferId) != null) {
      rebuildWatching();
    }
  }

  private synchronized void rebuildWatching() {
    watching = pending.values().toArray(new Pending[0]);
  }

  private void run() {
    if (!belled && SLACK_NS > 0 && !dev.kvferry.rdma.TimerSlack.set(SLACK_NS)) {
      log.debug("done-word watcher {}: timer slack not set, parks keep the kernel's", thread.getName());
    }
    long lastNews = System.nanoTime();
    while (running) {
      if (pending.isEmpty()) {
        LockSupport.park(this);
        lastNews = System.nanoTime();
        continue;
      }
      // Read before the look: a ring after it ends the sleep below at once.
      int bell = belled ? words.bell() : 0;
      boolean news = false;
      boolean spinNear = false;
      long now = System.nanoTime();
      for (Pending p : watching) {
        if (!p.landed(words)) {
          if (p.near(words)) {
            if (p.nearSince == 0) {
              p.nearSince = now;
              nearHints++;
            }
            // Each transfer spins for itself: one whose P died after its hint stops costing
            // spins after its own 20 ms, and takes none from the others.
            spinNear |= now - p.nearSince < NEAR_SPIN_NS;
          }
        } else if (pending.remove(p.transferId, p)) {
          WriteStamps.mark(WriteStamps.Stage.DONE_WORD_SEEN);
          news = true;
          try {
            onDone.accept(p.transferId);
          } catch (RuntimeException e) {
            log.warn("done word of transfer {}: {}", p.transferId, e.toString());
          }
          // After the callback, which reports the request: until then the array still holds p,
          // but p is out of pending, so a second look cannot fire it again.
          rebuildWatching();
        }
      }
      now = System.nanoTime();
      if (news) {
        lastNews = now;
      } else if (belled) {
        words.awaitBell(bell, BELL_WAIT_NS);
      } else if (now - lastNews < SPIN_NS || spinNear) {
        // Spin after news (where configured) and through a transfer's last layer (P's hint):
        // a park there costs the word's landing up to a park's length.
        Thread.onSpinWait();
      } else {
        LockSupport.parkNanos(this, PARK_NS);
      }
    }
  }

  @Override
  public void close() {
    running = false;
    LockSupport.unpark(thread);
    if (belled) {
      words.ring();
    }
    try {
      thread.join(1000);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
    }
    words.close();
  }
}
