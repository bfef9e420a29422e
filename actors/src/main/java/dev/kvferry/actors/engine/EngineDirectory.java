package dev.kvferry.actors.engine;

import dev.kvferry.actors.EngineActor;
import java.util.ArrayList;
import java.util.Collection;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.Set;
import org.apache.pekko.actor.typed.ActorRef;

/**
 * The engine workers this node can see, by engine id and TP rank, built from Receptionist
 * listings. Immutable: a new listing makes a new directory.
 */
public final class EngineDirectory {

  public static final EngineDirectory EMPTY = new EngineDirectory(Map.of(), List.of(), Set.of());

  /** One worker: who it is and where to send to it. */
  public record Entry(EngineIdentity identity, ActorRef<EngineActor.Command> ref) {}

  /**
   * Two workers listed under the same engine id and TP rank (two engines given one id): {@code
   * kept} is routed to, {@code refused} is not. Every node keeps the same one (the first by
   * address), so they agree without talking.
   */
  public record Duplicate(String engineId, int tpRank, ActorRef<EngineActor.Command> kept,
      ActorRef<EngineActor.Command> refused) {
    /** The error to show: names both workers and what to do. */
    public String message() {
      return "engine id " + engineId + " (TP rank " + tpRank + ") is registered twice: by "
          + kept.path() + " and by " + refused.path() + "; the second is refused (no transfer"
          + " goes to it while both are listed). Give every engine its own id.";
    }
  }

  private final Map<String, Map<Integer, Entry>> byEngine;
  private final List<Duplicate> duplicates;
  /** Every engine id listed, with workers known to have stopped: membership, not routing. */
  private final Set<String> listedIds;

  private EngineDirectory(Map<String, Map<Integer, Entry>> byEngine, List<Duplicate> duplicates,
      Set<String> listedIds) {
    this.byEngine = byEngine;
    this.duplicates = duplicates;
    this.listedIds = listedIds;
  }

  /**
   * Builds a directory from listed refs; refs whose names are not engine names are skipped. Two
   * refs with one engine id and TP rank do not overwrite each other silently: one is kept, and
   * the other is listed in {@link #duplicates()}.
   */
  public static EngineDirectory of(Collection<ActorRef<EngineActor.Command>> refs) {
    return of(refs, Set.of());
  }

  /**
   * As {@link #of(Collection)}, but workers in {@code stopped} (their actor is known to have
   * terminated while the listing still shows it) are never routed to: an engine that attached
   * again is reached at its new incarnation at once, and messages for one whose only listed
   * worker stopped wait for a live one, instead of going to dead letters. Such an engine still
   * {@link #contains counts as listed} until the listing drops it, so nothing treats it as gone
   * sooner than the cluster says (the block-lifetime rule).
   */
  public static EngineDirectory of(Collection<ActorRef<EngineActor.Command>> refs,
      Set<ActorRef<EngineActor.Command>> stopped) {
    Set<String> listedIds = new HashSet<>();
    for (ActorRef<EngineActor.Command> ref : refs) {
      EngineIdentity.fromActorName(ref.path().name()).ifPresent(id -> listedIds.add(id.engineId()));
    }
    List<ActorRef<EngineActor.Command>> ordered = new ArrayList<>(refs);
    ordered.removeAll(stopped);
    // The same order on every node: by path, then by incarnation (uid) for one path reused.
    ordered.sort(
        java.util.Comparator.<ActorRef<EngineActor.Command>, String>comparing(
                r -> r.path().toString())
            .thenComparingInt(r -> r.path().uid()));
    Map<String, Map<Integer, Entry>> map = new HashMap<>();
    List<Duplicate> duplicates = new ArrayList<>();
    for (ActorRef<EngineActor.Command> ref : ordered) {
      EngineIdentity.fromActorName(ref.path().name())
          .ifPresent(
              id -> {
                Map<Integer, Entry> ranks =
                    map.computeIfAbsent(id.engineId(), k -> new HashMap<>());
                Entry first = ranks.putIfAbsent(id.tpRank(), new Entry(id, ref));
                if (first != null) {
                  duplicates.add(new Duplicate(id.engineId(), id.tpRank(), first.ref(), ref));
                }
              });
    }
    map.replaceAll((k, v) -> Map.copyOf(v));
    return new EngineDirectory(Map.copyOf(map), List.copyOf(duplicates), Set.copyOf(listedIds));
  }

  /** Merges two directories (e.g. the listings of both roles). */
  public EngineDirectory merge(EngineDirectory other) {
    Map<String, Map<Integer, Entry>> map = new HashMap<>(byEngine);
    List<Duplicate> dups = new ArrayList<>(duplicates);
    dups.addAll(other.duplicates);
    for (Map.Entry<String, Map<Integer, Entry>> e : other.byEngine.entrySet()) {
      Map<Integer, Entry> mine = map.get(e.getKey());
      if (mine == null) {
        map.put(e.getKey(), e.getValue());
        continue;
      }
      // One id used by engines of both roles: the same refusal as within one listing.
      for (Entry theirs : e.getValue().values()) {
        Entry kept = mine.get(theirs.identity().tpRank());
        if (kept != null) {
          dups.add(new Duplicate(e.getKey(), theirs.identity().tpRank(), kept.ref(), theirs.ref()));
        }
      }
    }
    Set<String> ids = new HashSet<>(listedIds);
    ids.addAll(other.listedIds);
    return new EngineDirectory(Map.copyOf(map), List.copyOf(dups), Set.copyOf(ids));
  }

  /** Workers refused because another worker already has their engine id and TP rank. */
  public List<Duplicate> duplicates() {
    return duplicates;
  }

  public Optional<Entry> find(String engineId, int tpRank) {
    Map<Integer, Entry> ranks = byEngine.get(engineId);
    return ranks == null ? Optional.empty() : Optional.ofNullable(ranks.get(tpRank));
  }

  /** Every TP rank of one engine, in rank order. */
  public List<Entry> ranksOf(String engineId) {
    Map<Integer, Entry> ranks = byEngine.getOrDefault(engineId, Map.of());
    List<Entry> out = new ArrayList<>(ranks.values());
    out.sort((a, b) -> Integer.compare(a.identity().tpRank(), b.identity().tpRank()));
    return out;
  }

  /**
   * Whether the listing shows {@code engineId}, even if only by workers known to have stopped
   * (then {@link #find} has nothing to route to until a live one is listed).
   */
  public boolean contains(String engineId) {
    return listedIds.contains(engineId);
  }

  /** Every engine id {@link #contains} is true for. */
  public Set<String> engineIds() {
    return java.util.Collections.unmodifiableSet(listedIds);
  }

  @Override
  public String toString() {
    return "EngineDirectory" + byEngine.keySet();
  }
}
