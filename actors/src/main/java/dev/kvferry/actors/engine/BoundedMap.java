package dev.kvferry.actors.engine;

import java.util.LinkedHashMap;
import java.util.function.Function;
import org.jspecify.annotations.Nullable;

/**
 * A map that holds at most {@code capacity} entries: putting one more evicts the oldest inserted.
 * For bookkeeping a misbehaving peer could otherwise grow without bound (ids of ended transfers,
 * failures and releases that came early); entries of transfers that end normally are removed, so
 * eviction only bounds the rest. Not thread-safe: owned by one actor.
 */
public final class BoundedMap<K, V> {
  private final int capacity;
  private final LinkedHashMap<K, V> entries = new LinkedHashMap<>();

  public BoundedMap(int capacity) {
    if (capacity < 1) {
      throw new IllegalArgumentException("capacity must be at least 1, not " + capacity);
    }
    this.capacity = capacity;
  }

  public void put(K key, V value) {
    entries.put(key, value);
    if (entries.size() > capacity) {
      K eldest = entries.keySet().iterator().next();
      entries.remove(eldest);
    }
  }

  public @Nullable V get(K key) {
    return entries.get(key);
  }

  /** The value under {@code key}, made by {@code make} (and put, maybe evicting) if absent. */
  public V computeIfAbsent(K key, Function<K, V> make) {
    V v = entries.get(key);
    if (v == null) {
      v = make.apply(key);
      put(key, v);
    }
    return v;
  }

  public @Nullable V remove(K key) {
    return entries.remove(key);
  }

  public boolean containsKey(K key) {
    return entries.containsKey(key);
  }

  public int size() {
    return entries.size();
  }
}
