package dev.kvferry.actors;

import dev.kvferry.actors.engine.AgentMetadata;
import dev.kvferry.actors.engine.EngineDirectory;
import dev.kvferry.actors.engine.PeerKey;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.function.Predicate;
import org.apache.pekko.actor.typed.ActorRef;
import org.jspecify.annotations.Nullable;

/**
 * Peer workers' metadata that one worker's {@link HandshakeActor} fetched, with the incarnation
 * (the listed actor ref, whose uid changes when the worker restarts) that served each. Only the
 * handshake actor writes it; the {@link ReaderActor} reads it directly when a load starts, so a
 * READ transfer from a peer already met skips the two mailbox hops of a Fetch before its first
 * read (the engine's forward waits on that read's first layer).
 */
final class PeerMetadataCache {

  record Entry(ActorRef<EngineActor.Command> incarnation, AgentMetadata metadata) {}

  private final Map<PeerKey, Entry> entries = new ConcurrentHashMap<>();

  @Nullable Entry get(PeerKey key) {
    return entries.get(key);
  }

  void put(PeerKey key, Entry entry) {
    entries.put(key, entry);
  }

  @Nullable Entry remove(PeerKey key) {
    return entries.remove(key);
  }

  /** Removes the entries {@code stale} picks (each passed to it once). */
  void removeIf(Predicate<Map.Entry<PeerKey, Entry>> stale) {
    entries.entrySet().removeIf(stale);
  }

  /**
   * The metadata of {@code key} if it was fetched from the incarnation {@code directory} lists
   * now, and that is incarnation {@code uid} (0: any); null otherwise (never fetched, or the worker
   * restarted or left since: ask the handshake actor, which fetches again).
   */
  @Nullable AgentMetadata listed(PeerKey key, EngineDirectory directory, int uid) {
    Entry e = entries.get(key);
    if (e == null || (uid != 0 && e.incarnation().path().uid() != uid)) {
      return null;
    }
    boolean current = directory.find(key.engineId(), key.tpRank())
        .map(found -> found.ref().equals(e.incarnation()))
        .orElse(false);
    return current ? e.metadata() : null;
  }
}
