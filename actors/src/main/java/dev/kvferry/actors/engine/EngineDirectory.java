package dev.kvferry.actors.engine;

import dev.kvferry.actors.EngineActor;
import java.util.ArrayList;
import java.util.Collection;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import org.apache.pekko.actor.typed.ActorRef;

/**
 * The engine workers this node can see, by engine id and TP rank, built from Receptionist
 * listings. Immutable: a new listing makes a new directory.
 */
public final class EngineDirectory {

  public static final EngineDirectory EMPTY = new EngineDirectory(Map.of());

  /** One worker: who it is and where to send to it. */
  public record Entry(EngineIdentity identity, ActorRef<EngineActor.Command> ref) {}

  private final Map<String, Map<Integer, Entry>> byEngine;

  private EngineDirectory(Map<String, Map<Integer, Entry>> byEngine) {
    this.byEngine = byEngine;
  }

  /** Builds a directory from listed refs; refs whose names are not engine names are skipped. */
  public static EngineDirectory of(Collection<ActorRef<EngineActor.Command>> refs) {
    Map<String, Map<Integer, Entry>> map = new HashMap<>();
    for (ActorRef<EngineActor.Command> ref : refs) {
      EngineIdentity.fromActorName(ref.path().name())
          .ifPresent(
              id ->
                  map.computeIfAbsent(id.engineId(), k -> new HashMap<>())
                      .put(id.tpRank(), new Entry(id, ref)));
    }
    map.replaceAll((k, v) -> Map.copyOf(v));
    return new EngineDirectory(Map.copyOf(map));
  }

  /** Merges two directories (e.g. the listings of both roles). */
  public EngineDirectory merge(EngineDirectory other) {
    Map<String, Map<Integer, Entry>> map = new HashMap<>(byEngine);
    map.putAll(other.byEngine);
    return new EngineDirectory(Map.copyOf(map));
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

  public boolean contains(String engineId) {
    return byEngine.containsKey(engineId);
  }

  @Override
  public String toString() {
    return "EngineDirectory" + byEngine.keySet();
  }
}
