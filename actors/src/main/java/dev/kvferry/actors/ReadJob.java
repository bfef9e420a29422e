package dev.kvferry.actors;

import dev.kvferry.actors.connector.ReqMeta;
import java.util.Arrays;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;
import org.jspecify.annotations.Nullable;

/**
 * D, READ: one transfer being read by a {@link ReaderActor}; used on its thread only, but for
 * {@link #cancelled} and the two counters the threads completing its reads keep.
 */
final class ReadJob {
  final ReqMeta request;
  /** P's workers this worker reads from (one, unless the TP sizes differ). */
  final int[] sources;
  int remaining;
  /** By layer: reads (one per source) not yet landed. */
  final int[] layerRemaining;
  /** Layer reads handed to the transport and not finished. */
  int inFlight;
  /** Why it is ending; non-null: no read starts, the ending waits for inFlight == 0. */
  @Nullable String failure;
  /** Seen by reads still queued on the io pool: they skip their copies. */
  final AtomicBoolean cancelled = new AtomicBoolean();
  /**
   * Kept by the threads completing the reads: reads that have not landed (a failed one never
   * counts down, so the transfer is then not reported at once), and the bytes of those that did.
   */
  final AtomicInteger notLanded;
  final AtomicLong landedBytes = new AtomicLong();

  ReadJob(ReqMeta request, int[] sources, int layers) {
    this.request = request;
    this.sources = sources;
    this.remaining = layers * sources.length;
    this.notLanded = new AtomicInteger(remaining);
    this.layerRemaining = new int[layers];
    Arrays.fill(layerRemaining, sources.length);
  }
}
