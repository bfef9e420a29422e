package dev.kvferry.actors;

import dev.kvferry.actors.engine.ConnectorSettings;
import dev.kvferry.actors.engine.TerminalIds;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.function.Consumer;
import org.apache.pekko.actor.typed.javadsl.TimerScheduler;
import org.jspecify.annotations.Nullable;
import org.slf4j.Logger;

/**
 * The {@link WriterActor}'s transfers: its jobs in progress by transfer id, and the ids of those
 * that ended so that late messages for them are recognised. A job begins with its defer timer
 * (keyed by transfer id) and ends here exactly once, written or failed, cancelling it. Used on the
 * writer's thread only.
 */
final class WriteJobs {
  private final Map<String, WriteJob> live = new HashMap<>();
  private final TerminalIds ended;
  private final WriteEndings endings;
  private final TimerScheduler<WriterActor.Command> timers;
  private final Logger log;
  private final Duration deferTimeout;
  /** Hears each job that ends (written, or failed with its copies drained). */
  private final Consumer<String> onEnded;

  WriteJobs(
      ConnectorSettings settings, WriteEndings endings, TimerScheduler<WriterActor.Command> timers,
      Logger log, Consumer<String> onEnded) {
    this.onEnded = onEnded;
    this.ended = new TerminalIds(settings.terminalIdCapacity());
    this.deferTimeout = settings.deferTimeout();
    this.endings = endings;
    this.timers = timers;
    this.log = log;
  }

  @Nullable WriteJob get(String transferId) {
    return live.get(transferId);
  }

  /** The transfer's job, begun by the first of a saved layer and D's blocks. */
  WriteJob getOrStart(String transferId, String requestId, String decodeEngineId) {
    WriteJob j = live.get(transferId);
    if (j == null) {
      j = new WriteJob(transferId, requestId, decodeEngineId);
      live.put(transferId, j);
      // The seed's defer timeout: a write whose remote blocks never come fails.
      timers.startSingleTimer(transferId, new WriterActor.DeferExpired(transferId), deferTimeout);
    }
    return j;
  }

  /** Whether the transfer's job ended (or it was abandoned before one began). */
  boolean ended(String transferId) {
    return ended.contains(transferId);
  }

  /** Whether the job has not ended yet. */
  boolean live(WriteJob j) {
    return live.containsKey(j.transferId);
  }

  /** Abandoned with no job here: saves that come later are refused and reported. */
  void endWithoutJob(String transferId) {
    ended.add(transferId);
  }

  /** The jobs in progress, copied: a caller may end some while it goes through them. */
  List<WriteJob> all() {
    return new ArrayList<>(live.values());
  }

  /** The jobs in progress that write to decode engine {@code engineId}, copied. */
  List<WriteJob> writingTo(String engineId) {
    List<WriteJob> writing = new ArrayList<>();
    for (WriteJob j : live.values()) {
      if (engineId.equals(j.decodeEngineId)) {
        writing.add(j);
      }
    }
    return writing;
  }

  /** The saved jobs as /kvferry/transfers shows them ("writing"). */
  List<TransferView> views(long nowMs) {
    List<TransferView> writes = new ArrayList<>();
    for (WriteJob j : live.values()) {
      if (j.saved()) { // otherwise only D's block ids so far: nothing of ours exists yet
        writes.add(j.view(nowMs));
      }
    }
    return writes;
  }

  /** Ends the job if every layer was written to every target: D hears WriteDone. */
  void completeIfDone(WriteJob j) {
    int[] ranks = j.targetRanks;
    if (ranks == null || !j.allWritten()) {
      return;
    }
    live.remove(j.transferId);
    timers.cancel(j.transferId);
    ended.add(j.transferId);
    endings.written(j, ranks);
    onEnded.accept(j.transferId);
  }

  /**
   * Ends a job that will not complete. Nothing new is written from here on; copies already handed
   * to the transport may still land in D's blocks and read ours, so D is told and our blocks are
   * freed only once every one of them has finished (DESIGN.md section 3, block lifetime).
   */
  void fail(WriteJob j, String reason) {
    if (j.failure != null) {
      return;
    }
    j.failure = reason;
    j.cancelled.set(true);
    timers.cancel(j.transferId);
    log.warn("write failed: {}", reason);
    endIfDrained(j);
  }

  /** Ends a failing job once none of its writes is in flight. */
  void endIfDrained(WriteJob j) {
    String failure = j.failure;
    if (j.inFlight > 0 || failure == null) {
      return;
    }
    live.remove(j.transferId);
    ended.add(j.transferId);
    endings.failed(j, failure);
    onEnded.accept(j.transferId);
  }

  /** The writer stops: submissions still queued on the io pool skip their copies. */
  void cancelAll() {
    live.values().forEach(j -> j.cancelled.set(true));
  }
}
