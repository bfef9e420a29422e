package dev.kvferry.actors.engine;

/** One worker of a peer engine: the engine and the worker's TP rank. A map key, never a string. */
public record PeerKey(String engineId, int tpRank) {
  /** "decode-0/tp1", for logs and errors only. */
  @Override
  public String toString() {
    return engineId + "/tp" + tpRank;
  }
}
