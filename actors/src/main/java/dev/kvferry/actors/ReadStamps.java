package dev.kvferry.actors;

import dev.kvferry.actors.connector.ReqMeta;
import dev.kvferry.rdma.CopyStamps;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import org.apache.pekko.actor.typed.Behavior;
import org.apache.pekko.actor.typed.BehaviorInterceptor;
import org.apache.pekko.actor.typed.TypedActorContext;
import org.apache.pekko.actor.typed.javadsl.Behaviors;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Where a READ-mode transfer spends its time on D's node, from the worker's {@code start_load_kv}
 * until its first and last layers' reads are queued (issue 18: the engine's wait for layer 0 is
 * the first thing its forward waits on), and on until the request is in the engine's next {@code
 * get_finished}. One {@link System#nanoTime()} per {@link Stage} and transfer; once the request is
 * reported the node logs one line with each stage as microseconds after the first. Off unless
 * {@code -Dkvferry.stamps=true}; off, each mark is a static boolean test.
 */
public final class ReadStamps {

  /** In the order a transfer's start passes them. */
  public enum Stage {
    /**
     * The load was handed to the workers: the scheduler's update_state_after_alloc (reads at
     * admission) or the worker's start_load_kv reached the connector (the engine port's thread).
     */
    START_LOAD,
    /**
     * D's EngineActor had finished the message before the StartLoad (the hand-over itself if it
     * was idle then): from here to {@link #ENGINE} is the hop alone, before it the actor's work.
     */
    ENGINE_FREE,
    /** D's EngineActor took the StartLoad from its mailbox. */
    ENGINE,
    /** D's ReaderActor took it from its mailbox and asked for P's metadata. */
    READER,
    /** P's metadata came back to the ReaderActor; the plan follows. */
    PEER_READY,
    /** The plan is made; the reads are handed to the transport. */
    ISSUED,
    /** Layer 0's read began (on an I/O thread; GPU-ordered, on the reader's own thread). */
    IO_STARTED,
    /** Layer 0's plan was uploaded (cuda: the transport's latest plan upload, if after IO_STARTED). */
    LAYER0_PLANNED,
    /** The transport returned layer 0's read (queued on the GPU, or done); then it is recorded. */
    LAYER0_RETURNED,
    /** Layer 0's reads were queued (GPU) or done (host). */
    LAYER0_QUEUED,
    /** The last layer's reads were queued (GPU) or done (host). */
    LAST_QUEUED,
    /** The last of its reads completed (seen by the thread completing it). */
    READS_LANDED,
    /** Its request went into the engine's finished list (what get_finished drains next). */
    REPORTED
  }

  private static final Logger log = LoggerFactory.getLogger(ReadStamps.class);
  private static final Stage[] STAGES = Stage.values();
  private static final boolean ON = Boolean.getBoolean("kvferry.stamps");
  /** Bounded: transfers never reported done (failed, aborted) are dropped wholesale. */
  private static final int MAX_TRANSFERS = 4096;
  private static final Map<String, long[]> stamps = new ConcurrentHashMap<>();

  private ReadStamps() {}

  public static void mark(String transferId, Stage stage) {
    if (ON) {
      mark(transferId, stage, System.nanoTime());
    }
  }

  /**
   * Layer 0's read returned from the transport: marks that, and before it the transport's latest
   * plan upload if that came after layer 0's read began (then it was this read's).
   */
  static void markLayer0Returned(String transferId) {
    if (!ON) {
      return;
    }
    long now = System.nanoTime();
    long[] at = stamps.get(transferId);
    long planned = CopyStamps.plannedNanos();
    long began = at == null ? 0 : at[Stage.IO_STARTED.ordinal()];
    if (began != 0 && planned > began) {
      mark(transferId, Stage.LAYER0_PLANNED, planned);
    }
    mark(transferId, Stage.LAYER0_RETURNED, now);
  }

  /** {@code engine} as it is, or with stamps on wrapped to mark each StartLoad's ENGINE_FREE. */
  static Behavior<EngineActor.Command> watchEngine(Behavior<EngineActor.Command> engine) {
    return ON ? Behaviors.intercept(EngineFree::new, engine) : engine;
  }

  /** Notes when the EngineActor finishes each message; marks it on the StartLoads it takes. */
  private static final class EngineFree
      extends BehaviorInterceptor<EngineActor.Command, EngineActor.Command> {
    private long lastDone;

    EngineFree() {
      super(EngineActor.Command.class);
    }

    @Override
    public Behavior<EngineActor.Command> aroundReceive(TypedActorContext<EngineActor.Command> ctx,
        EngineActor.Command message, ReceiveTarget<EngineActor.Command> target) {
      if (message instanceof EngineActor.StartLoad load) {
        for (ReqMeta r : load.metadata().reqsToRecv()) {
          long[] at = stamps.get(r.transferId());
          if (at != null) {
            mark(r.transferId(), Stage.ENGINE_FREE, Math.max(at[0], lastDone));
          }
        }
      }
      Behavior<EngineActor.Command> next = target.apply(ctx, message);
      lastDone = System.nanoTime();
      return next;
    }
  }

  /** Marks {@code stage} at {@code now} (a {@link System#nanoTime()} taken elsewhere). */
  private static void mark(String transferId, Stage stage, long now) {
    if (stage == Stage.START_LOAD && stamps.size() >= MAX_TRANSFERS) {
      stamps.clear();
    }
    long[] at = stage == Stage.START_LOAD
        ? stamps.computeIfAbsent(transferId, k -> new long[STAGES.length])
        : stamps.get(transferId);
    if (at == null) {
      return;
    }
    at[stage.ordinal()] = now;
    if (stage == Stage.REPORTED) {
      stamps.remove(transferId);
      StringBuilder line =
          new StringBuilder("read start stamps, us after the load was handed over: transfer ")
              .append(transferId);
      for (Stage s : STAGES) {
        line.append(' ').append(s.name().toLowerCase(java.util.Locale.ROOT)).append('=');
        line.append(at[s.ordinal()] == 0 ? "-" : String.format(java.util.Locale.ROOT, "%.1f",
            (at[s.ordinal()] - at[0]) / 1e3));
      }
      log.info(line.toString());
    }
  }
}
