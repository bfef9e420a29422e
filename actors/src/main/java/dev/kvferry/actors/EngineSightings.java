package dev.kvferry.actors;

import dev.kvferry.actors.engine.EngineDirectory;
import dev.kvferry.actors.engine.TerminalIds;

/**
 * The peer engines a tracker has seen: those the directory lists now, and (bounded) those ever
 * listed or known to have gone unseen, so that an engine not listed now is told apart as gone
 * rather than not joined yet. Not thread-safe: owned by one actor.
 */
final class EngineSightings {

  private EngineDirectory directory = EngineDirectory.EMPTY;
  private final TerminalIds known;

  EngineSightings(int capacity) {
    this.known = new TerminalIds(capacity);
  }

  /** Takes the directory now; returns the one before it. */
  EngineDirectory update(EngineDirectory now) {
    EngineDirectory before = directory;
    directory = now;
    for (String id : now.engineIds()) {
      if (!known.contains(id)) {
        known.add(id);
      }
    }
    return before;
  }

  /** An engine no directory here showed has gone (its workers that spoke to us stopped). */
  void goneUnseen(String engineId) {
    if (!known.contains(engineId)) {
      known.add(engineId);
    }
  }

  boolean listed(String engineId) {
    return directory.contains(engineId);
  }

  /**
   * Known here and not listed now: it left. (An engine that attached again under that id and is
   * not listed here yet looks the same; the listing takes a moment, the same rule as a listing
   * that drops it.)
   */
  boolean left(String engineId) {
    return !engineId.isEmpty() && known.contains(engineId) && !directory.contains(engineId);
  }
}
