package dev.kvferry.actors;

import dev.kvferry.actors.connector.ReqMeta;
import dev.kvferry.rdma.TransferStatus;
import java.util.Arrays;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;
import org.jspecify.annotations.Nullable;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * D, READ: one transfer being read by a {@link ReaderActor}; used on its thread only, but for
 * {@link #cancelled} and what {@link #landed} keeps on the threads completing its reads.
 */
final class ReadJob {
  private static final Logger log = LoggerFactory.getLogger(ReadJob.class);

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

  /**
   * On the thread that completed one of these reads, before the reader hears of it: the last of
   * them to land reports the request done to the engine at once through {@code sink} (the hops to
   * the reader and on to the tracker are thread hand-overs each: docs/gpu.md, "The first hop
   * split"). Every byte is in D's blocks by then; the reader still settles the transfer and
   * releases P when its messages arrive. Nothing here may throw: the read's own status is what
   * the reader hears.
   */
  void landed(FinishedSink sink, @Nullable TransferStatus status, @Nullable Throwable error) {
    if (error != null || status == null || !status.succeeded()) {
      return; // never counts down: the failure is the reader's to report
    }
    landedBytes.addAndGet(status.bytesMoved());
    if (notLanded.decrementAndGet() == 0 && !cancelled.get()) {
      long bytes = landedBytes.get(); // every read's add came before its count down
      String transferId = request.transferId();
      try {
        ReadStamps.mark(transferId, ReadStamps.Stage.READS_LANDED);
        sink.landedEarly(transferId, false, bytes);
      } catch (RuntimeException e) { // an observer's: the report, if made, stands
        log.warn("reporting transfer {} done at once failed", transferId, e);
      }
    }
  }
}
