package dev.kvferry.actors;

import dev.kvferry.actors.connector.ConnectorMetadata;
import dev.kvferry.actors.engine.BoundedMap;
import dev.kvferry.actors.engine.EngineDirectory;
import dev.kvferry.actors.engine.EngineIdentity;
import dev.kvferry.actors.plan.KvCacheGeometry;
import java.util.List;
import java.util.OptionalInt;
import org.agrona.collections.IntHashSet;
import org.apache.pekko.actor.typed.ActorRef;
import org.apache.pekko.actor.typed.Behavior;
import org.apache.pekko.actor.typed.javadsl.AbstractBehavior;
import org.apache.pekko.actor.typed.javadsl.ActorContext;
import org.apache.pekko.actor.typed.javadsl.Behaviors;
import org.apache.pekko.actor.typed.javadsl.Receive;

/**
 * P's side of READ mode: the blocks P keeps for D's reads (the tracker holds them, with the
 * read-abort deadline). Counts D's releases (one from every D worker that reads from this worker)
 * and, when the deadline passes, asks those D workers to let go.
 */
public final class ReleaseActor extends AbstractBehavior<ReleaseActor.Command> {

  public sealed interface Command extends LocalOnly {}

  /** The blocks this step keeps for D (the worker's StartLoad; it told the tracker of them). */
  public record KeepForReaders(List<ConnectorMetadata.PendingSend> sends) implements Command {}

  /** A D worker is done with a transfer's blocks. */
  public record Released(PeerProtocol.Release release) implements Command {}

  /** D did not release a transfer by the read-abort deadline (from the tracker). */
  public record ReleaseOverdue(String transferId, String decodeEngineId) implements Command {}

  public record DirectoryChanged(EngineDirectory directory) implements Command {}

  private final EngineIdentity self;
  private final boolean mla;
  private final long readAbortTimeoutMs;
  private final ActorRef<RequestTrackerActor.Command> tracker;
  private final PeerOutbox outbox;
  /** D with another TP size: the D workers that released so far, by transfer id. */
  private final BoundedMap<String, IntHashSet> releasesSeen;

  public static Behavior<Command> create(
      WorkerSetup setup, ActorRef<RequestTrackerActor.Command> tracker) {
    return Behaviors.setup(ctx -> new ReleaseActor(ctx, setup, tracker));
  }

  private ReleaseActor(
      ActorContext<Command> ctx, WorkerSetup setup,
      ActorRef<RequestTrackerActor.Command> tracker) {
    super(ctx);
    this.self = setup.identity();
    this.mla = setup.geometry().layout() == KvCacheGeometry.Layout.MLA;
    this.readAbortTimeoutMs = setup.settings().readAbortTimeout().toMillis();
    this.tracker = tracker;
    this.outbox = new PeerOutbox(ctx.getLog(), setup.settings());
    // Entries of finished transfers go, so eviction only bounds what a misbehaving peer can make
    // us hold.
    this.releasesSeen = new BoundedMap<>(setup.settings().terminalIdCapacity());
  }

  @Override
  public Receive<Command> createReceive() {
    return newReceiveBuilder()
        .onMessage(KeepForReaders.class, this::onKeepForReaders)
        .onMessage(Released.class, this::onReleased)
        .onMessage(ReleaseOverdue.class, this::onReleaseOverdue)
        .onMessage(DirectoryChanged.class, this::onDirectoryChanged)
        .build();
  }

  private Behavior<Command> onKeepForReaders(KeepForReaders m) {
    if (!mla) {
      return this;
    }
    for (ConnectorMetadata.PendingSend s : m.sends()) {
      // MLA, D with fewer workers: some P workers have no reader; they free at once.
      outbox.withTpSizeOf(s.consumerEngineId(), s.transferId(), decodeTp -> {
        if (PeerPlanning.targetsFor(self, OptionalInt.of(decodeTp), true).length == 0) {
          tracker.tell(new RequestTrackerActor.Released(s.transferId()));
        }
      });
    }
    return this;
  }

  private Behavior<Command> onReleased(Released m) {
    PeerProtocol.Release r = m.release();
    if (allReleased(r)) {
      tracker.tell(new RequestTrackerActor.Released(r.transferId()));
    }
    return this;
  }

  /** Whether every D worker that reads from this worker has now released the transfer. */
  private boolean allReleased(PeerProtocol.Release m) {
    if (m.decodeTpSize() < 1 || m.decodeTpSize() == self.tpSize()) {
      return true;
    }
    int need = PeerPlanning.targetsFor(self, OptionalInt.of(m.decodeTpSize()), mla).length;
    if (need <= 1) {
      return true;
    }
    IntHashSet seen = releasesSeen.computeIfAbsent(m.transferId(), k -> new IntHashSet());
    seen.add(m.decodeTpRank());
    if (seen.size() < need) {
      return false;
    }
    releasesSeen.remove(m.transferId());
    return true;
  }

  /** D did not release in time; ask the D workers that read from us to let go. */
  private Behavior<Command> onReleaseOverdue(ReleaseOverdue m) {
    int[] readers =
        PeerPlanning.targetsFor(
            self, PeerPlanning.tpSizeOf(outbox.directory(), m.decodeEngineId()), mla);
    String reason =
        "prefill engine " + self.engineId() + " waited " + readAbortTimeoutMs
            + " ms for transfer " + m.transferId() + " to be read; release its blocks";
    for (int reader : readers) {
      outbox.send(m.decodeEngineId(), reader,
          new PeerProtocol.TransferFailed(m.transferId(), self.engineId(), reason, self.tpRank()));
    }
    return this;
  }

  private Behavior<Command> onDirectoryChanged(DirectoryChanged m) {
    outbox.replaceDirectory(m.directory());
    outbox.flush();
    return this;
  }
}
