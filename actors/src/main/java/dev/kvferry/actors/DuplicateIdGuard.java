package dev.kvferry.actors;

import dev.kvferry.actors.engine.EngineDirectory;
import dev.kvferry.actors.engine.EngineIdentity;
import java.util.HashSet;
import java.util.Set;
import org.apache.pekko.actor.typed.ActorRef;
import org.apache.pekko.actor.typed.javadsl.ActorContext;
import org.apache.pekko.actor.typed.receptionist.Receptionist;
import org.jspecify.annotations.Nullable;

/**
 * What an {@link EngineActor} does when another worker is listed under its engine id and TP rank
 * (two engines given one id, or a restarted engine whose old incarnation is still listed): says
 * so once, naming both, and leaves the listing while every node routes to the other; takes over
 * once that one is gone. Used from the worker's thread only.
 */
final class DuplicateIdGuard {
  private final ActorContext<EngineActor.Command> ctx;
  private final EngineIdentity self;
  private final Set<String> reportedDuplicates = new HashSet<>();
  /** The reachable worker with our engine id and TP rank that every node routes to instead. */
  private @Nullable ActorRef<EngineActor.Command> displacedBy;

  DuplicateIdGuard(ActorContext<EngineActor.Command> ctx, EngineIdentity self) {
    this.ctx = ctx;
    this.self = self;
  }

  /**
   * Another worker is listed under our engine id and TP rank: say so, naming both. Every node
   * routes to the same one of the two (see {@link EngineDirectory#of}); the other gets no
   * transfer while both are listed (a restarted engine whose old incarnation is not yet removed
   * takes over once it is).
   */
  void report(EngineDirectory merged) {
    for (EngineDirectory.Duplicate d : merged.duplicates()) {
      if (d.engineId().equals(self.engineId()) && reportedDuplicates.add(d.message())) {
        ctx.getLog().error(d.message());
      }
    }
    if (reportedDuplicates.size() > 64) {
      reportedDuplicates.clear(); // bounded; a duplicate still listed is reported again
    }
  }

  /**
   * Refuses this worker while another reachable worker holds its engine id and TP rank and every
   * node routes to that one (see {@link EngineDirectory#of}): it leaves the listing, so no
   * transfer reaches it, and says so naming both. It takes over once that worker is gone (a
   * restarted engine whose old incarnation had not been removed yet).
   */
  void refuseOrResume(
      Set<ActorRef<EngineActor.Command>> reachable, @Nullable EngineDirectory ownRole) {
    ActorRef<Receptionist.Command> receptionist = ctx.getSystem().receptionist();
    ActorRef<EngineActor.Command> kept = displacedBy;
    if (kept != null) {
      if (!reachable.contains(kept)) {
        ctx.getLog().info("{}: the worker {} that displaced it is gone; serving again",
            self.label(), kept.path());
        displacedBy = null;
        receptionist.tell(Receptionist.register(EngineActor.serviceKey(self.role()), ctx.getSelf()));
      }
      return;
    }
    if (ownRole == null) {
      return;
    }
    for (EngineDirectory.Duplicate d : ownRole.duplicates()) {
      if (d.refused().equals(ctx.getSelf()) && reachable.contains(d.kept())) {
        ctx.getLog().error("{}: refused: {}", self.label(), d.message());
        displacedBy = d.kept();
        receptionist.tell(Receptionist.deregister(EngineActor.serviceKey(self.role()), ctx.getSelf()));
        return;
      }
    }
  }
}
