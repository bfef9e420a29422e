package dev.kvferry.actors.engine;

/**
 * A bounded set of finished transfer ids, oldest evicted first, so that late messages for a
 * finished transfer are recognised and ignored. Not thread-safe: owned by one actor.
 */
public final class TerminalIds {
  private final BoundedMap<String, Boolean> ids;

  public TerminalIds(int capacity) {
    this.ids = new BoundedMap<>(capacity);
  }

  public void add(String transferId) {
    ids.put(transferId, Boolean.TRUE);
  }

  public boolean contains(String transferId) {
    return ids.containsKey(transferId);
  }

  public int size() {
    return ids.size();
  }
}
