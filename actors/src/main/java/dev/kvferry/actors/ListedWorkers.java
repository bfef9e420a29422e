package dev.kvferry.actors;

import dev.kvferry.actors.connector.Role;
import dev.kvferry.actors.engine.EngineDirectory;
import dev.kvferry.actors.engine.EngineIdentity;
import java.time.Duration;
import java.util.EnumMap;
import java.util.HashMap;
import java.util.HashSet;
import java.util.Iterator;
import java.util.Map;
import java.util.Optional;
import java.util.Set;
import java.util.function.Function;
import org.apache.pekko.actor.typed.ActorRef;
import org.apache.pekko.actor.typed.javadsl.ActorContext;
import org.apache.pekko.actor.typed.receptionist.Receptionist;
import org.jspecify.annotations.Nullable;

/**
 * The engine workers one {@link EngineActor} sees listed, by role, and those of them known to have
 * stopped while still listed (an engine detached, maybe to attach again at once): the directory
 * its children route by leaves the stopped ones out, but still counts their engines as listed
 * until the listing drops them (block lifetime rule). Also the peer workers that introduced
 * themselves by asking for our metadata: the listing may never show one (its engine attached and
 * died before the Receptionist's news of it got here), and then only its stop says it went. Every
 * listed or introduced worker but the owner is death-watched through the owner's context. Not
 * thread-safe: owned by one actor.
 *
 * <p>An engine that detaches and attaches again stops its old worker before its new one
 * registers, so a listing can show neither for a moment. Workers a listing drops while their node
 * stays up in the cluster <em>linger</em>: their engine counts as listed (never routed to) until
 * a worker of it is listed again or the re-attach grace is over. Without that, every transfer
 * with such an engine could end as "left the cluster" although the engine is back a moment later.
 * A worker dropped while its node is leaving, down or removed does not linger (one whose node
 * starts leaving during the grace lingers on until the grace is over: that only delays "left").
 */
final class ListedWorkers {

  private final ActorContext<EngineActor.Command> ctx;
  private final Role ownRole;
  /** The watch message the owner gets when a listed worker stops. */
  private final Function<ActorRef<EngineActor.Command>, EngineActor.Command> stoppedMessage;
  /** The last listing of each role: every worker, unreachable ones too. */
  private final Map<Role, Set<ActorRef<EngineActor.Command>>> listed = new EnumMap<>(Role.class);
  /** Our own role's workers reachable now. */
  private Set<ActorRef<EngineActor.Command>> reachableOwnRole = Set.of();
  private final Set<ActorRef<EngineActor.Command>> watched = new HashSet<>();
  private final Set<ActorRef<EngineActor.Command>> stopped = new HashSet<>();
  /** Peer workers that asked for our metadata and have not stopped, with their engine ids. */
  private final Map<ActorRef<EngineActor.Command>, String> introduced = new HashMap<>();
  private final Map<Role, EngineDirectory> directories = new EnumMap<>(Role.class);
  /** Workers the listing dropped while their node stays up, by role, until the grace is over. */
  private final Map<ActorRef<EngineActor.Command>, Role> lingering = new HashMap<>();
  private final Duration reattachGrace;
  /** The message the owner gets when a lingering worker's grace is over. */
  private final Function<ActorRef<EngineActor.Command>, EngineActor.Command> graceOverMessage;
  private final ClusterMembers members;

  ListedWorkers(ActorContext<EngineActor.Command> ctx, Role ownRole,
      Function<ActorRef<EngineActor.Command>, EngineActor.Command> stoppedMessage,
      Duration reattachGrace,
      Function<ActorRef<EngineActor.Command>, EngineActor.Command> graceOverMessage) {
    this.ctx = ctx;
    this.ownRole = ownRole;
    this.stoppedMessage = stoppedMessage;
    this.reattachGrace = reattachGrace;
    this.graceOverMessage = graceOverMessage;
    this.members = new ClusterMembers(ctx.getSystem());
  }

  /** Takes a Receptionist listing; returns whether it is of our own role. */
  boolean take(Receptionist.Listing listing) {
    for (Role role : Role.values()) {
      if (listing.isForKey(EngineActor.serviceKey(role))) {
        // Unreachable workers too: one that is unreachable may still copy (a partition heals), so
        // only a worker the cluster downed and removed counts as gone (block lifetime rule).
        Set<ActorRef<EngineActor.Command>> now =
            Set.copyOf(listing.getAllServiceInstances(EngineActor.serviceKey(role)));
        linger(role, listed.getOrDefault(role, Set.of()), now);
        listed.put(role, now);
        if (role == ownRole) {
          reachableOwnRole =
              Set.copyOf(listing.getServiceInstances(EngineActor.serviceKey(role)));
        }
      }
    }
    watchListed();
    rebuild();
    return listing.isForKey(EngineActor.serviceKey(ownRole));
  }

  /**
   * Workers of {@code role} that {@code now} drops while their node stays up linger (unless a
   * worker of their engine is still listed); those whose engine {@code now} lists again stop
   * lingering.
   */
  private void linger(Role role, Set<ActorRef<EngineActor.Command>> before,
      Set<ActorRef<EngineActor.Command>> now) {
    Set<String> listedEngines = new HashSet<>();
    now.forEach(ref -> engineId(ref).ifPresent(listedEngines::add));
    lingering.entrySet().removeIf(e -> e.getValue() == role
        && engineId(e.getKey()).map(listedEngines::contains).orElse(true));
    for (ActorRef<EngineActor.Command> ref : before) {
      if (now.contains(ref) || reattachGrace.isZero() || lingering.containsKey(ref)) {
        continue;
      }
      boolean engineGone = engineId(ref).map(id -> !listedEngines.contains(id)).orElse(false);
      boolean nodeStays =
          !ref.path().address().hasGlobalScope() || members.isUp(ref.path().address());
      if (engineGone && nodeStays) {
        lingering.put(ref, role);
        ctx.scheduleOnce(reattachGrace, ctx.getSelf(), graceOverMessage.apply(ref));
        ctx.getLog().debug("worker {} no longer listed while its node stays: its engine counts as"
            + " listed for {} ms more, in case it attaches again", ref.path(),
            reattachGrace.toMillis());
      }
    }
  }

  /**
   * The re-attach grace of a lingering worker is over: returns its role if it still lingered
   * (its engine no longer counts as listed), else null.
   */
  @Nullable Role graceOver(ActorRef<EngineActor.Command> ref) {
    Role role = lingering.remove(ref);
    if (role != null) {
      watchListed();
      rebuild();
    }
    return role;
  }

  private static Optional<String> engineId(ActorRef<EngineActor.Command> ref) {
    return EngineIdentity.fromActorName(ref.path().name()).map(EngineIdentity::engineId);
  }

  /**
   * What a worker's stop changed.
   *
   * @param directoryChanged the worker is still listed: routing skips it from now on, so messages
   *     reach the new incarnation or wait
   * @param introducedChanged it had introduced itself: {@link #introducedEngines()} may have lost
   *     its engine
   */
  record Stopped(boolean directoryChanged, boolean introducedChanged) {}

  /** A watched worker stopped. */
  Stopped stopped(ActorRef<EngineActor.Command> ref) {
    watched.remove(ref);
    String engine = introduced.remove(ref);
    boolean stillListed = listed.values().stream().anyMatch(refs -> refs.contains(ref));
    ctx.getLog().debug("worker {} stopped (still listed: {}, introduced as {})", ref.path(),
        stillListed, engine);
    boolean changed = stillListed && stopped.add(ref);
    if (changed) {
      rebuild();
    }
    return new Stopped(changed, engine != null);
  }

  /**
   * A peer worker of {@code engineId} asked for our metadata: watched until it stops (one that
   * has stopped already gets its Terminated at once). Returns whether it is new.
   */
  boolean introduced(String engineId, ActorRef<EngineActor.Command> ref) {
    if (ref.equals(ctx.getSelf()) || introduced.containsKey(ref) || stopped.contains(ref)) {
      return false; // (a stopped one is still listed: the listing says when it goes)
    }
    introduced.put(ref, engineId);
    if (watched.add(ref)) {
      ctx.watchWith(ref, stoppedMessage.apply(ref));
    }
    return true;
  }

  /** The engines with a live worker that introduced itself (listed or not). */
  Set<String> introducedEngines() {
    return Set.copyOf(introduced.values());
  }

  /** Every role's workers in one directory, less the stopped ones. */
  EngineDirectory directory() {
    EngineDirectory merged = EngineDirectory.EMPTY;
    for (EngineDirectory d : directories.values()) {
      merged = merged.merge(d);
    }
    return merged;
  }

  /** Our own role's directory; null before its first listing. */
  @Nullable EngineDirectory ownRole() {
    return directories.get(ownRole);
  }

  /** Our own role's workers reachable now and not known to have stopped. */
  Set<ActorRef<EngineActor.Command>> reachableOwnRole() {
    Set<ActorRef<EngineActor.Command>> reachable = new HashSet<>(reachableOwnRole);
    reachable.removeAll(stopped);
    return reachable;
  }

  private void rebuild() {
    Set<ActorRef<EngineActor.Command>> unroutable = new HashSet<>(stopped);
    unroutable.addAll(lingering.keySet());
    for (Map.Entry<Role, Set<ActorRef<EngineActor.Command>>> e : listed.entrySet()) {
      Set<ActorRef<EngineActor.Command>> counted = new HashSet<>(e.getValue());
      lingering.forEach((ref, role) -> {
        if (role == e.getKey()) {
          counted.add(ref);
        }
      });
      directories.put(e.getKey(), EngineDirectory.of(counted, unroutable));
    }
    ctx.getLog().debug("listed {}, stopped {}, lingering {}", listed, stopped, lingering.keySet());
  }

  /**
   * Watches every listed worker but the owner; forgets those neither the listing shows nor
   * introduced themselves.
   */
  private void watchListed() {
    Set<ActorRef<EngineActor.Command>> all = new HashSet<>(introduced.keySet());
    listed.values().forEach(all::addAll);
    all.addAll(lingering.keySet());
    stopped.retainAll(all);
    for (Iterator<ActorRef<EngineActor.Command>> it = watched.iterator(); it.hasNext(); ) {
      ActorRef<EngineActor.Command> ref = it.next();
      if (!all.contains(ref)) {
        ctx.unwatch(ref);
        it.remove();
      }
    }
    for (ActorRef<EngineActor.Command> ref : all) {
      if (!ref.equals(ctx.getSelf()) && !stopped.contains(ref) && watched.add(ref)) {
        ctx.watchWith(ref, stoppedMessage.apply(ref));
      }
    }
  }
}
