package dev.kvferry.actors;

import dev.kvferry.actors.engine.BoundedMap;
import dev.kvferry.actors.engine.ConnectorSettings;
import dev.kvferry.actors.engine.EngineDirectory;
import dev.kvferry.actors.engine.TerminalIds;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import org.apache.pekko.actor.typed.ActorRef;
import org.apache.pekko.actor.typed.Behavior;
import org.apache.pekko.actor.typed.javadsl.AbstractBehavior;
import org.apache.pekko.actor.typed.javadsl.ActorContext;
import org.apache.pekko.actor.typed.javadsl.Behaviors;
import org.apache.pekko.actor.typed.javadsl.Receive;
import org.apache.pekko.actor.typed.javadsl.TimerScheduler;
import org.jspecify.annotations.Nullable;

/**
 * Per-request transfer state of one worker, on both sides: on P the sends that wait for a release
 * (READ) or for their writes (WRITE); on D the receives in flight, each with a deadline. Every
 * ending lands in the {@link FinishedSink} exactly once (a receive its done word or last read
 * reported at once, through the sink's claim, is not reported again here); late messages for
 * ended transfers are recognised by a bounded set of terminal transfer ids and ignored. Replaces
 * the seed's done_req_ids lists, _reqs_to_send and _recving_transfers.
 */
public final class RequestTrackerActor extends AbstractBehavior<RequestTrackerActor.Command> {

  public sealed interface Command extends LocalOnly {}

  /**
   * D: a receive begins (WRITE: P will write; READ: we read) into {@code localBlockIds}, which are
   * reported as load errors if it fails.
   */
  public record ExpectReceive(
      String requestId, String transferId, String producerEngineId, int[] localBlockIds)
      implements Command {
    public ExpectReceive {
      localBlockIds = localBlockIds == null ? new int[0] : localBlockIds.clone();
    }

    public ExpectReceive(String requestId, String transferId, String producerEngineId) {
      this(requestId, transferId, producerEngineId, new int[0]);
    }
  }

  /**
   * D: the request was aborted after its transfer ended (or never began here): report it ended so
   * the engine frees the blocks whose free it delayed.
   */
  public record ReportAborted(String requestId, String transferId, String reason)
      implements Command {}

  /** D: the KV of a transfer is in place. */
  public record ReceiveSucceeded(String transferId, long bytes) implements Command {}

  /** Either side: a transfer failed. */
  public record TransferFailed(String transferId, String reason) implements Command {}

  /** P, READ: blocks kept for D until released or until the deadline. */
  public record ExpectRelease(
      String requestId, String transferId, long deadlineEpochMs, String consumerEngineId)
      implements Command {}

  /** P, READ: D read the blocks (or gave up) and lets them go. */
  public record Released(String transferId) implements Command {}

  /** P, WRITE: the writer finished (all writes done and D told), or failed. */
  public record SendFinished(String requestId, String transferId, SendOutcome outcome)
      implements Command {}

  public record DirectoryChanged(EngineDirectory directory) implements Command {}

  /** Engines with a live worker that asked us for metadata; one unlisted and gone left unseen. */
  public record IntroducedChanged(Set<String> engineIds) implements Command {}

  /** Transfers in flight for /kvferry/transfers, with P's writes in progress ({@code writes}). */
  public record GetSnapshot(ActorRef<TransferSnapshot> replyTo, List<TransferView> writes)
      implements Command {}

  private record DeadlinePassed(String transferId) implements Command {}

  /** P, READ: a transfer's reader had left; the grace for it to show itself again is over. */
  private record ReaderAbsent(String transferId) implements Command {}

  private final String selfLabel;
  private final ConnectorSettings settings;
  private final FinishedSink sink;
  /**
   * The worker that owns the transfers: a deadline is a request to end a transfer, which only the
   * owner can do once no copy can touch the blocks (DESIGN.md section 3, block lifetime).
   */
  private final ActorRef<EngineActor.Command> owner;
  private final TimerScheduler<Command> timers;
  private final Map<String, TrackedTransfer> active = new HashMap<>();
  private final TerminalIds terminal;
  /** P, READ: releases that overtook their ExpectRelease (D can be faster than P's next step). */
  private final TerminalIds earlyReleases;
  /** D: failures (reasons by transfer id) that overtook their ExpectReceive; bounded. */
  private final BoundedMap<String, String> earlyFailures;
  /** D: aborts reported before their receive was expected (it is reported already). */
  private final TerminalIds abortedEarly;
  /** Peer engines listed now, ever, or introduced: which readers have left. */
  private final EngineSightings engines;

  /**
   * @param owner told when a transfer's deadline passes ({@link EngineActor.ReceiveOverdue}, {@link
   *     EngineActor.ReleaseOverdue}); it ends the transfer and reports back
   */
  public static Behavior<Command> create(String selfLabel, ConnectorSettings settings,
      FinishedSink sink, ActorRef<EngineActor.Command> owner) {
    return Behaviors.setup(ctx -> Behaviors.withTimers(
        timers -> new RequestTrackerActor(ctx, timers, selfLabel, settings, sink, owner)));
  }

  private RequestTrackerActor(ActorContext<Command> ctx, TimerScheduler<Command> timers,
      String selfLabel, ConnectorSettings settings, FinishedSink sink,
      ActorRef<EngineActor.Command> owner) {
    super(ctx);
    this.timers = timers;
    this.owner = owner;
    this.selfLabel = selfLabel;
    this.settings = settings;
    this.sink = sink;
    this.terminal = new TerminalIds(settings.terminalIdCapacity());
    this.earlyReleases = new TerminalIds(settings.terminalIdCapacity());
    this.earlyFailures = new BoundedMap<>(settings.terminalIdCapacity());
    this.abortedEarly = new TerminalIds(settings.terminalIdCapacity());
    this.engines = new EngineSightings(settings.terminalIdCapacity());
  }

  @Override
  public Receive<Command> createReceive() {
    return newReceiveBuilder()
        .onMessage(ExpectReceive.class, this::onExpectReceive)
        .onMessage(ReceiveSucceeded.class, this::onReceiveSucceeded)
        .onMessage(TransferFailed.class, this::onTransferFailed)
        .onMessage(ExpectRelease.class, this::onExpectRelease)
        .onMessage(Released.class, this::onReleased)
        .onMessage(SendFinished.class, this::onSendFinished)
        .onMessage(DeadlinePassed.class, this::onDeadline)
        .onMessage(DirectoryChanged.class, this::onDirectoryChanged)
        .onMessage(IntroducedChanged.class, this::onIntroducedChanged)
        .onMessage(ReaderAbsent.class, this::onReaderAbsent)
        .onMessage(GetSnapshot.class, this::onSnapshot)
        .onMessage(ReportAborted.class, this::onReportAborted)
        .build();
  }

  private boolean refuseDuplicate(String requestId, String transferId, boolean sending) {
    if (active.containsKey(transferId) || terminal.contains(transferId)) {
      String reason = "duplicate transfer id " + transferId + " for request " + requestId + " on "
          + selfLabel + ": refused";
      getContext().getLog().warn(reason);
      sink.failed(requestId, reason, sending);
      return true;
    }
    return false;
  }

  private Behavior<Command> onExpectReceive(ExpectReceive m) {
    if (abortedEarly.contains(m.transferId())) {
      // Its abort came first and was reported; nothing is read for it: let a load wait end.
      sink.layerLoads().ended(m.transferId());
      return this;
    }
    if (refuseDuplicate(m.requestId(), m.transferId(), false)) {
      return this;
    }
    String failedEarly = earlyFailures.remove(m.transferId());
    if (failedEarly != null) {
      // P gave up before we announced our blocks: fail now instead of at the transfer timeout.
      terminal.add(m.transferId());
      sink.layerLoads().ended(m.transferId());
      sink.failedLoad(m.requestId(), failedEarly, m.localBlockIds());
      sink.observer().transferEnded(TransferObserver.Outcome.FAILED, 0, -1);
      return this;
    }
    active.put(m.transferId(), TrackedTransfer.receiving(m));
    timers.startSingleTimer(
        m.transferId(), new DeadlinePassed(m.transferId()), settings.transferTimeout());
    return this;
  }

  private Behavior<Command> onReceiveSucceeded(ReceiveSucceeded m) {
    boolean reportedEarly = sink.settleReceive(m.transferId());
    TrackedTransfer t = take(m.transferId(), "succeeded");
    if (t != null) {
      sink.layerLoads().ended(t.transferId);
      sink.addBytes(m.bytes());
      if (!reportedEarly) { // else the word's watcher or the last read reported and observed it
        sink.received(t.transferId, t.requestId);
        observe(TransferObserver.Outcome.RECEIVED, m.bytes(), t);
      }
    }
    return this;
  }

  private Behavior<Command> onTransferFailed(TransferFailed m) {
    // Reported done at once (its done word, or its last read), the engine has its answer: a later
    // ending (a timeout, P's failure) reports nothing; an abort after that done comes as
    // ReportAborted (the receiver or reader settles the receive first) and is reported there.
    boolean reportedEarly = sink.settleReceive(m.transferId());
    if (!active.containsKey(m.transferId()) && !terminal.contains(m.transferId())) {
      if (!reportedEarly) {
        earlyFailures.put(m.transferId(), m.reason());
      }
      return this;
    }
    TrackedTransfer t = take(m.transferId(), "failed");
    if (t != null) {
      if (t.state == TrackedTransfer.State.RECEIVING) {
        sink.layerLoads().ended(t.transferId);
        if (reportedEarly) {
          getContext().getLog().debug("transfer {} ended ({}) after it was reported done at once"
              + " (every byte had landed); reported as done", t.transferId, m.reason());
          return this;
        }
        // In the same report as the failure: the engine recomputes these blocks.
        sink.failedLoad(t.requestId, m.reason(), t.localBlockIds);
      } else {
        sink.failed(t.requestId, m.reason(), true);
      }
      observe(TransferObserver.Outcome.FAILED, 0, t);
    }
    return this;
  }

  private Behavior<Command> onReportAborted(ReportAborted m) {
    if (active.containsKey(m.transferId())) {
      return this; // still live: the owner ends it and its ending is the report
    }
    if (!terminal.contains(m.transferId())) {
      abortedEarly.add(m.transferId()); // never expected here: its receive may still come
    }
    terminal.add(m.transferId());
    sink.failed(m.requestId(), m.reason(), false);
    return this;
  }

  private Behavior<Command> onExpectRelease(ExpectRelease m) {
    if (earlyReleases.contains(m.transferId()) && !terminal.contains(m.transferId())) {
      terminal.add(m.transferId());
      sink.doneSending(m.requestId());
      return this;
    }
    if (refuseDuplicate(m.requestId(), m.transferId(), true)) {
      return this;
    }
    TrackedTransfer kept = TrackedTransfer.awaitingRelease(m);
    active.put(m.transferId(), kept);
    long delayMs = Math.max(0, m.deadlineEpochMs() - System.currentTimeMillis());
    timers.startSingleTimer(
        m.transferId(), new DeadlinePassed(m.transferId()), Duration.ofMillis(delayMs));
    if (engines.left(m.consumerEngineId())) {
      // D was here and has left: no directory change will end the wait now, so it ends after a
      // grace instead of at the deadline, unless D attaches again under that id meanwhile.
      awaitReaderBack(kept);
    }
    return this;
  }

  /** Frees a transfer kept for a reader that left, unless the reader shows itself in time. */
  private void awaitReaderBack(TrackedTransfer t) {
    Duration grace = settings.handshakeTimeout().multipliedBy(settings.handshakeAttempts());
    getContext().getLog().info("transfer {}: its reader has left; its blocks are freed in {} ms"
        + " unless the reader comes back", t.transferId, grace.toMillis());
    t.readerAbsent = true;
    timers.startSingleTimer(t.absenceKey(), new ReaderAbsent(t.transferId), grace);
  }

  private Behavior<Command> onReleased(Released m) {
    if (!active.containsKey(m.transferId()) && !terminal.contains(m.transferId())) {
      earlyReleases.add(m.transferId());
      return this;
    }
    TrackedTransfer t = take(m.transferId(), "released");
    if (t != null) {
      sink.doneSending(t.requestId);
      observe(TransferObserver.Outcome.SENT, 0, t);
    }
    return this;
  }

  private Behavior<Command> onSendFinished(SendFinished m) {
    if (terminal.contains(m.transferId())) {
      return this;
    }
    terminal.add(m.transferId());
    if (m.outcome() instanceof SendOutcome.Sent sent) {
      sink.addBytes(sent.bytes());
      sink.doneSending(m.requestId());
      sink.observer().transferEnded(TransferObserver.Outcome.SENT, sent.bytes(), -1);
    } else if (m.outcome() instanceof SendOutcome.Failed failed) {
      sink.failed(m.requestId(), failed.reason(), true);
      sink.observer().transferEnded(TransferObserver.Outcome.FAILED, 0, -1);
    }
    return this;
  }

  private Behavior<Command> onDeadline(DeadlinePassed m) {
    TrackedTransfer t = active.get(m.transferId());
    if (t == null) {
      return this;
    }
    if (t.state == TrackedTransfer.State.AWAITING_RELEASE) {
      if (t.peerEngineId.isEmpty() || !engines.listed(t.peerEngineId)) {
        // The seed's abort timeout, kept where no reader can exist: the decode engine is unknown
        // or not a member (it needs P's metadata, served to members only, to read).
        take(m.transferId(), "deadline");
        getContext().getLog().info("request {} was not read by D in time; freeing its blocks",
            t.requestId);
        sink.doneSending(t.requestId);
        observe(TransferObserver.Outcome.EXPIRED, 0, t);
        return this;
      }
      // D may be reading right now: ask it to stop; the blocks go back on its Release (or when
      // it leaves the cluster), never on the clock alone. Asked again while D stays listed: an
      // ask can be lost, or miss D workers (D's TP size unknown, as while D attaches again).
      getContext().getLog().info("request {} was not read by {} in time; asking it to let go{}",
          t.requestId, t.peerEngineId, t.overdue ? " (again)" : "");
      t.overdue = true;
      owner.tell(new EngineActor.ReleaseOverdue(t.transferId, t.peerEngineId));
      timers.startSingleTimer(
          t.transferId, new DeadlinePassed(t.transferId), settings.readAbortTimeout());
      return this;
    }
    if (t.overdue) {
      return this; // a receive is asked to end once; it ends when no copy can land any more
    }
    // A timeout is a request to end the transfer, not a licence to free: the owner asks P to
    // abandon and reports the failure once no copy can land in our blocks.
    t.overdue = true;
    owner.tell(new EngineActor.ReceiveOverdue(t.transferId, t.overdue(settings.transferTimeout())));
    return this;
  }

  private Behavior<Command> onDirectoryChanged(DirectoryChanged m) {
    EngineDirectory before = engines.update(m.directory());
    // Receives end through the owner, which first waits for its own reads to stop.
    active.values().stream().filter(t -> t.readerLeft(before, m.directory())).toList()
        .forEach(this::freeKept);
    return this;
  }

  private Behavior<Command> onIntroducedChanged(IntroducedChanged m) {
    Set<String> gone = engines.introduced(m.engineIds());
    active.values().stream().filter(t -> gone.stream().anyMatch(t::keptFor))
        .forEach(this::awaitReaderBack);
    return this;
  }

  private Behavior<Command> onReaderAbsent(ReaderAbsent m) {
    TrackedTransfer t = active.get(m.transferId());
    if (t != null && engines.left(t.peerEngineId)) {
      freeKept(t);
      observe(TransferObserver.Outcome.EXPIRED, 0, t);
    }
    return this;
  }

  /** P, READ: its reader is gone: nobody reads its blocks; free them now. */
  private void freeKept(TrackedTransfer t) {
    getContext().getLog().info("request {}: its reader {} has left; freeing its blocks",
        t.requestId, t.peerEngineId);
    take(t.transferId, "peer left");
    sink.doneSending(t.requestId);
  }

  private void observe(TransferObserver.Outcome outcome, long bytes, TrackedTransfer t) {
    sink.observer().transferEnded(outcome, bytes, System.nanoTime() - t.startedNanos);
  }

  private @Nullable TrackedTransfer take(String transferId, String why) {
    TrackedTransfer t = active.remove(transferId);
    if (t == null) {
      if (!terminal.contains(transferId)) {
        getContext().getLog().debug("ignoring {} for unknown transfer {}", why, transferId);
      }
      return null;
    }
    timers.cancel(transferId);
    if (t.readerAbsent) {
      timers.cancel(t.absenceKey());
    }
    terminal.add(transferId);
    return t;
  }

  private Behavior<Command> onSnapshot(GetSnapshot m) {
    long now = System.currentTimeMillis();
    List<TransferView> views = new ArrayList<>(active.values().stream().map(t -> t.view(now)).toList());
    views.addAll(m.writes());
    m.replyTo().tell(TransferSnapshot.of(views));
    return this;
  }
}
