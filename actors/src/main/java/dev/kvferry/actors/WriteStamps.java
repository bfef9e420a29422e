package dev.kvferry.actors;

import java.util.concurrent.atomic.AtomicLongArray;

/**
 * Where a WRITE-mode layer's write spends its time between P's layer event and D done, for the
 * bench's breakdown (issue 19): one {@link System#nanoTime()} per {@link Stage}, the latest of each
 * kept. Off unless {@link #enable()} was called (or {@code -Dkvferry.stamps=true}); off, each mark
 * is a static boolean test. Only the latest mark of a stage is kept, so per-layer stages describe
 * the last layer only while layers are written one after another (the bench's paced rows).
 */
public final class WriteStamps {

  /** In the order a layer's write passes them. */
  public enum Stage {
    /** D's receiver sent its blocks to P (RemoteBlocks, WRITE). */
    BLOCKS_TOLD,
    /** P's engine actor took D's blocks (RemoteBlocks) from its mailbox. */
    BLOCKS_ARRIVED,
    /** P's writer took D's blocks (RemoteBlocks) from its mailbox. */
    BLOCKS_SEEN,
    /** P's writer took the layer's SaveLayer from its mailbox. */
    SAVE_SEEN,
    /** P's writer took the layer's fired event from its mailbox. */
    FIRED_SEEN,
    /** P's writer handed the layer's copies to the I/O executor. */
    ISSUED,
    /** An I/O executor thread started the layer's submission. */
    IO_STARTED,
    /** The transport's write call returned (the copy runs on or was handed to its own thread). */
    SUBMIT_RETURNED,
    /** P's writer took the layer's completion from its mailbox. */
    WRITTEN_SEEN,
    /** P's writer saw every layer written and sent WriteDone. */
    WRITE_DONE_SENT,
    /** P's writer queued D's done word behind the writes (all layers issued, sealed). */
    DONE_WORD_QUEUED,
    /** The task that hands D's done word to the transport started. */
    DONE_WORD_TASK,
    /** D's done word was stored behind the writes (as the writer's future saw it). */
    DONE_WORD_STORED,
    /** D's watcher saw its done word. */
    DONE_WORD_SEEN,
    /** D's receiver took the writer's end (word or WriteDone) from its mailbox. */
    WRITER_DONE_SEEN
  }

  private static final Stage[] STAGES = Stage.values();
  private static boolean on = Boolean.getBoolean("kvferry.stamps");
  private static final AtomicLongArray latest = new AtomicLongArray(STAGES.length);

  private WriteStamps() {}

  /** Turns marking on; call before the actor systems start. */
  public static void enable() {
    on = true;
  }

  /** Forgets every stage (0: not passed since). */
  public static void reset() {
    for (int i = 0; i < STAGES.length; i++) {
      latest.set(i, 0);
    }
  }

  static void mark(Stage stage) {
    if (on) {
      latest.set(stage.ordinal(), System.nanoTime());
    }
  }

  /** When {@code stage} was last passed, 0 if not since {@link #reset()}. */
  public static long nanos(Stage stage) {
    return latest.get(stage.ordinal());
  }
}
