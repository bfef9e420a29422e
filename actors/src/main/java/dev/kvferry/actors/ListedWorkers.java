package dev.kvferry.actors;

import dev.kvferry.actors.connector.Role;
import dev.kvferry.actors.engine.EngineDirectory;
import java.util.EnumMap;
import java.util.HashMap;
import java.util.HashSet;
import java.util.Iterator;
import java.util.Map;
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

  ListedWorkers(ActorContext<EngineActor.Command> ctx, Role ownRole,
      Function<ActorRef<EngineActor.Command>, EngineActor.Command> stoppedMessage) {
    this.ctx = ctx;
    this.ownRole = ownRole;
    this.stoppedMessage = stoppedMessage;
  }

  /** Takes a Receptionist listing; returns whether it is of our own role. */
  boolean take(Receptionist.Listing listing) {
    for (Role role : Role.values()) {
      if (listing.isForKey(EngineActor.serviceKey(role))) {
        // Unreachable workers too: one that is unreachable may still copy (a partition heals), so
        // only a worker the cluster downed and removed counts as gone (block lifetime rule).
        listed.put(role, Set.copyOf(listing.getAllServiceInstances(EngineActor.serviceKey(role))));
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
    for (Map.Entry<Role, Set<ActorRef<EngineActor.Command>>> e : listed.entrySet()) {
      directories.put(e.getKey(), EngineDirectory.of(e.getValue(), stopped));
    }
    ctx.getLog().debug("listed {}, stopped {}", listed, stopped);
  }

  /**
   * Watches every listed worker but the owner; forgets those neither the listing shows nor
   * introduced themselves.
   */
  private void watchListed() {
    Set<ActorRef<EngineActor.Command>> all = new HashSet<>(introduced.keySet());
    listed.values().forEach(all::addAll);
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
