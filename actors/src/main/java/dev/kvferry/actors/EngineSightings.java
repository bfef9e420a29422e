package dev.kvferry.actors;

import dev.kvferry.actors.engine.BoundedMap;
import dev.kvferry.actors.engine.EngineDirectory;
import dev.kvferry.actors.engine.TerminalIds;
import java.util.HashSet;
import java.util.Set;

/**
 * The peer engines a tracker has seen: listed now, ever listed (bounded), with a live worker that
 * introduced itself by asking for our metadata, or whose introduced workers all stopped while no
 * listing showed them (bounded). An engine known here and now neither listed nor introduced has
 * left, or attached again and not shown itself yet. Not thread-safe: owned by one actor.
 */
final class EngineSightings {

  private EngineDirectory directory = EngineDirectory.EMPTY;
  private final TerminalIds everListed;
  private Set<String> introduced = Set.of();
  private final BoundedMap<String, Boolean> goneUnseen;

  EngineSightings(int capacity) {
    this.everListed = new TerminalIds(capacity);
    this.goneUnseen = new BoundedMap<>(capacity);
  }

  /** Takes the directory now; returns the one before it. */
  EngineDirectory update(EngineDirectory now) {
    EngineDirectory before = directory;
    directory = now;
    for (String id : now.engineIds()) {
      if (!everListed.contains(id)) {
        everListed.add(id);
      }
    }
    return before;
  }

  /**
   * Takes the engines with a live introduced worker; returns those that went unseen: no live
   * introduced worker any more, and not listed.
   */
  Set<String> introduced(Set<String> live) {
    Set<String> gone = new HashSet<>();
    for (String id : introduced) {
      if (!live.contains(id) && !directory.contains(id)) {
        goneUnseen.put(id, Boolean.TRUE);
        gone.add(id);
      }
    }
    live.forEach(goneUnseen::remove);
    introduced = Set.copyOf(live);
    return gone;
  }

  boolean listed(String engineId) {
    return directory.contains(engineId);
  }

  /** Known here, and now neither listed nor introduced. */
  boolean left(String engineId) {
    return !engineId.isEmpty() && !directory.contains(engineId) && !introduced.contains(engineId)
        && (everListed.contains(engineId) || goneUnseen.containsKey(engineId));
  }
}
