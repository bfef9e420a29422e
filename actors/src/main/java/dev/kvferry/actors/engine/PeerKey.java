package dev.kvferry.actors.engine;

import org.jspecify.annotations.Nullable;

/** One worker of a peer engine: the engine and the worker's TP rank. A map key, never a string. */
public record PeerKey(String engineId, int tpRank) {

  /**
   * Written out rather than the record's generated one: that goes through method handles, which
   * made one map lookup on a READ's start take tens of microseconds in a node that had not
   * compiled them yet (docs/results/2026-12-05-peer-key-lookups.txt).
   */
  @Override
  public int hashCode() {
    return 31 * engineId.hashCode() + tpRank;
  }

  @Override
  public boolean equals(@Nullable Object o) {
    return o instanceof PeerKey k && tpRank == k.tpRank && engineId.equals(k.engineId);
  }

  /** "decode-0/tp1", for logs and errors only. */
  @Override
  public String toString() {
    return engineId + "/tp" + tpRank;
  }
}
