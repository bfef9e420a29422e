package dev.kvferry.actors;

import dev.kvferry.actors.engine.AgentMetadata;
import dev.kvferry.actors.engine.ConnectorSettings;
import dev.kvferry.actors.engine.EngineDirectory;
import dev.kvferry.actors.engine.EngineIdentity;
import dev.kvferry.actors.engine.HandshakeException;
import dev.kvferry.actors.engine.PeerKey;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import org.apache.pekko.actor.Address;
import org.apache.pekko.actor.typed.ActorRef;
import org.apache.pekko.actor.typed.Behavior;
import org.apache.pekko.actor.typed.javadsl.AbstractBehavior;
import org.apache.pekko.actor.typed.javadsl.ActorContext;
import org.apache.pekko.actor.typed.javadsl.Behaviors;
import org.apache.pekko.actor.typed.javadsl.Receive;
import org.apache.pekko.actor.typed.javadsl.TimerScheduler;
import org.jspecify.annotations.Nullable;

/**
 * Serves this worker's metadata and fetches remote workers' metadata. One fetch is in flight per
 * remote worker however many requests wait on it; a fetch is retried with doubling backoff and a
 * final failure is reported to every waiter. Replaces the seed's ZMQ listener thread, handshake
 * executor and futures map.
 */
public final class HandshakeActor extends AbstractBehavior<HandshakeActor.Command> {

  public sealed interface Command extends LocalOnly {}

  /** Serve our metadata to a peer. */
  public record Serve(PeerProtocol.GetMetadata request) implements Command {}

  /**
   * Fetch (or return cached) metadata of worker {@code tpRank} of {@code engineId}: of its
   * incarnation whose actor uid is {@code incarnation}, waiting (as for a worker not listed yet)
   * while the directory lists another; 0: of whichever incarnation is listed.
   */
  public record Fetch(String engineId, int tpRank, int incarnation, ActorRef<Result> replyTo)
      implements Command {
    public Fetch(String engineId, int tpRank, ActorRef<Result> replyTo) {
      this(engineId, tpRank, 0, replyTo);
    }
  }

  public record DirectoryChanged(EngineDirectory directory) implements Command {}

  private record Fetched(
      PeerKey key,
      int attempt,
      ActorRef<EngineActor.Command> asked,
      PeerProtocol.MetadataReply reply,
      Throwable error)
      implements Command {}

  private record RetryDue(PeerKey key, int attempt) implements Command {}

  /** The outcome of a fetch. */
  public sealed interface Result extends LocalOnly {
    String engineId();

    int tpRank();
  }

  /** {@code from}: the worker incarnation whose metadata this is (null: not known). */
  public record Ready(String engineId, int tpRank, AgentMetadata metadata,
      @Nullable ActorRef<EngineActor.Command> from) implements Result {}

  public record Failed(String engineId, int tpRank, String reason) implements Result {}

  private final AgentMetadata local;
  private final @Nullable ActorRef<EngineActor.Command> owner;
  private final byte[] localBlob;
  /** The cluster membership askers are checked against (none without a cluster: local only). */
  private final ClusterMembers members;
  private final ConnectorSettings settings;
  private final TimerScheduler<Command> timers;
  /**
   * Metadata by worker, with the incarnation that served it: a worker back under the same id
   * never gets the old one. Shared with this worker's reader, which reads it without asking.
   */
  private final PeerMetadataCache cache;
  private final Map<PeerKey, List<Waiter>> waiting = new HashMap<>();

  /** A Fetch waiting for its answer; {@code incarnation} 0: any. */
  private record Waiter(ActorRef<Result> replyTo, int incarnation) {
    boolean takes(ActorRef<EngineActor.Command> worker) {
      return incarnation == 0 || worker.path().uid() == incarnation;
    }
  }
  private EngineDirectory directory = EngineDirectory.EMPTY;
  /** Fetches waiting for their engine to appear in the listing, with their attempt number. */
  private final Map<PeerKey, Integer> notListed = new HashMap<>();

  public static Behavior<Command> create(AgentMetadata local, ConnectorSettings settings) {
    return create(local, settings, null);
  }

  /**
   * @param owner told {@link EngineActor.PeerGone} with the metadata of each worker incarnation
   *     that left, so its transport can release what it keeps for it; null: nobody
   */
  public static Behavior<Command> create(
      AgentMetadata local, ConnectorSettings settings,
      @Nullable ActorRef<EngineActor.Command> owner) {
    return create(local, settings, owner, new PeerMetadataCache());
  }

  /** As above, keeping what it fetches in {@code cache} (only this actor writes it). */
  static Behavior<Command> create(
      AgentMetadata local, ConnectorSettings settings,
      @Nullable ActorRef<EngineActor.Command> owner, PeerMetadataCache cache) {
    return Behaviors.setup(
        ctx ->
            Behaviors.withTimers(
                timers -> new HandshakeActor(ctx, timers, local, settings, owner, cache)));
  }

  private HandshakeActor(
      ActorContext<Command> ctx,
      TimerScheduler<Command> timers,
      AgentMetadata local,
      ConnectorSettings settings,
      @Nullable ActorRef<EngineActor.Command> owner,
      PeerMetadataCache cache) {
    super(ctx);
    this.owner = owner;
    this.cache = cache;
    this.timers = timers;
    this.local = local;
    this.localBlob = local.pack();
    this.members = new ClusterMembers(ctx.getSystem());
    this.settings = settings;
  }

  @Override
  public Receive<Command> createReceive() {
    return newReceiveBuilder()
        .onMessage(Serve.class, this::onServe)
        .onMessage(Fetch.class, this::onFetch)
        .onMessage(DirectoryChanged.class, this::onDirectoryChanged)
        .onMessage(Fetched.class, this::onFetched)
        .onMessage(RetryDue.class, m -> attempt(m.key(), m.attempt()))
        .build();
  }

  private Behavior<Command> onServe(Serve m) {
    ActorRef<PeerProtocol.MetadataReply> to = m.request().replyTo();
    Address from = to.path().address();
    if (from.hasGlobalScope() && !members.isIn(from)) {
      // Artery delivers messages from any system that can reach our port, joined or not; the
      // metadata (CMA pid and addresses, CUDA IPC handles, tcp tokens) goes to members only.
      getContext().getLog().warn(
          "refused metadata of {} to {}: not a member of the cluster", local.engineId(), from);
      return this;
    }
    to.tell(new PeerProtocol.MetadataReply(local.engineId(), local.tpRank(), localBlob));
    ActorRef<EngineActor.Command> asker = m.request().asker();
    if (owner != null && asker != null && asker.path().address().equals(from)) {
      // (a worker introduces itself only, never another system's)
      EngineIdentity.fromActorName(asker.path().name())
          .ifPresent(id -> owner.tell(new EngineActor.PeerIntroduced(id.engineId(), asker)));
    }
    return this;
  }

  private Behavior<Command> onFetch(Fetch m) {
    PeerKey key = new PeerKey(m.engineId(), m.tpRank());
    Waiter waiter = new Waiter(m.replyTo(), m.incarnation());
    PeerMetadataCache.Entry cached = cache.get(key);
    boolean listed = cached != null && isListed(key, cached.incarnation());
    if (cached != null && listed && waiter.takes(cached.incarnation())) {
      m.replyTo().tell(
          new Ready(key.engineId(), key.tpRank(), cached.metadata(), cached.incarnation()));
      return this;
    }
    if (cached != null && !listed) {
      cache.remove(key);
      if (owner != null) {
        owner.tell(new EngineActor.PeerGone(cached.metadata()));
      }
    }
    List<Waiter> waiters = waiting.get(key);
    if (waiters != null) {
      waiters.add(waiter); // one fetch in flight per remote worker
      return this;
    }
    waiters = new ArrayList<>();
    waiters.add(waiter);
    waiting.put(key, waiters);
    return attempt(key, 1);
  }

  private Behavior<Command> attempt(PeerKey key, int attempt) {
    if (!waiting.containsKey(key)) {
      return this;
    }
    Optional<EngineDirectory.Entry> entry = directory.find(key.engineId(), key.tpRank());
    List<Waiter> waiters = waiting.getOrDefault(key, List.of());
    if (entry.isEmpty() || waiters.stream().noneMatch(w -> w.takes(entry.get().ref()))) {
      // Not listed, or listed as another incarnation than the one asked for (an engine that
      // attached again: the old one can stay listed for a moment after it stopped).
      if (attempt >= settings.handshakeAttempts()) {
        String msg = "handshake with " + key + " failed: " + (entry.isEmpty()
            ? "engine " + key.engineId() + " is not a member of the cluster"
            : "the worker incarnation asked for (uid " + waiters.get(0).incarnation()
                + ") is not listed; " + entry.get().ref() + " is");
        getContext().getLog().warn(msg);
        finish(key, new Failed(key.engineId(), key.tpRank(), msg));
        return this;
      }
      // Not listed yet (registrations take a moment to spread): the next directory change retries
      // at once; the timer bounds the wait.
      notListed.put(key, attempt);
      timers.startSingleTimer(key, new RetryDue(key, attempt + 1), settings.handshakeTimeout());
      return this;
    }
    notListed.remove(key);
    getContext()
        .ask(
            PeerProtocol.MetadataReply.class,
            entry.get().ref(),
            settings.handshakeTimeout(),
            replyTo -> new PeerProtocol.GetMetadata(replyTo, owner),
            (reply, error) -> new Fetched(key, attempt, entry.get().ref(), reply, error));
    return this;
  }

  private Behavior<Command> onFetched(Fetched m) {
    if (!waiting.containsKey(m.key())) {
      return this;
    }
    if (m.error() != null) {
      return retryOrFail(
          m.key(),
          m.attempt(),
          "no answer from " + m.key() + " within " + settings.handshakeTimeout().toMillis() + " ms");
    }
    try {
      AgentMetadata peer = AgentMetadata.unpack(m.reply().blob());
      if (!peer.engineId().equals(m.key().engineId()) || peer.tpRank() != m.key().tpRank()) {
        throw new HandshakeException(
            "asked " + m.key() + " but its metadata names "
                + new PeerKey(peer.engineId(), peer.tpRank()));
      }
      local.checkCompatibleWith(peer);
      if (isListed(m.key(), m.asked())) {
        cache.put(m.key(), new PeerMetadataCache.Entry(m.asked(), peer));
      }
      answer(m.key(), m.asked(),
          new Ready(m.key().engineId(), m.key().tpRank(), peer, m.asked()), m.attempt());
    } catch (HandshakeException e) {
      // Bad or incompatible metadata will not improve by asking again.
      // The reason reaches the requests' failures: it must say whose metadata was bad.
      String reason = "handshake with " + m.key() + " failed: " + e.getMessage();
      getContext().getLog().warn(reason);
      finish(m.key(), new Failed(m.key().engineId(), m.key().tpRank(), reason));
    }
    return this;
  }

  private Behavior<Command> retryOrFail(PeerKey key, int attempt, String reason) {
    if (attempt >= settings.handshakeAttempts()) {
      String msg =
          "handshake with " + key + " failed after " + attempt + " attempts: " + reason;
      getContext().getLog().warn(msg);
      finish(key, new Failed(key.engineId(), key.tpRank(), msg));
      return this;
    }
    Duration backoff = settings.handshakeBackoff().multipliedBy(1L << Math.min(attempt - 1, 10));
    timers.startSingleTimer(key, new RetryDue(key, attempt + 1), backoff);
    return this;
  }

  private boolean isListed(PeerKey key, ActorRef<EngineActor.Command> incarnation) {
    return directory
        .find(key.engineId(), key.tpRank())
        .map(e -> e.ref().equals(incarnation))
        .orElse(false);
  }

  private void finish(PeerKey key, Result result) {
    timers.cancel(key);
    notListed.remove(key);
    List<Waiter> waiters = waiting.remove(key);
    if (waiters != null) {
      waiters.forEach(w -> w.replyTo().tell(result));
    }
  }

  /**
   * Answers the waiters that take {@code from}'s metadata; those that asked for another
   * incarnation are tried again at once (asked if the directory lists theirs now, else they wait
   * as for a worker not listed yet).
   */
  private void answer(PeerKey key, ActorRef<EngineActor.Command> from, Ready ready, int attempt) {
    List<Waiter> waiters = waiting.getOrDefault(key, List.of());
    List<Waiter> others = new ArrayList<>();
    for (Waiter w : waiters) {
      if (w.takes(from)) {
        w.replyTo().tell(ready);
      } else {
        others.add(w);
      }
    }
    if (others.isEmpty()) {
      timers.cancel(key);
      notListed.remove(key);
      waiting.remove(key);
      return;
    }
    waiting.put(key, others);
    attempt(key, attempt + 1);
  }

  private Behavior<Command> onDirectoryChanged(DirectoryChanged m) {
    directory = m.directory();
    // A worker that left or restarted (a new incarnation under the same id, maybe with no gap in
    // the listing) may have new regions: forget what the old one told us.
    cache.removeIf(e -> {
      if (isListed(e.getKey(), e.getValue().incarnation())) {
        return false;
      }
      if (owner != null) {
        owner.tell(new EngineActor.PeerGone(e.getValue().metadata()));
      }
      return true;
    });
    for (Map.Entry<PeerKey, Integer> waitingForListing : new HashMap<>(notListed).entrySet()) {
      if (directory.find(waitingForListing.getKey().engineId(), waitingForListing.getKey().tpRank())
          .isPresent()) {
        attempt(waitingForListing.getKey(), waitingForListing.getValue());
      }
    }
    return this;
  }
}
