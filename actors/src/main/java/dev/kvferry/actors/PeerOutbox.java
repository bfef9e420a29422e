package dev.kvferry.actors;

import dev.kvferry.actors.engine.ConnectorSettings;
import dev.kvferry.actors.engine.EngineDirectory;
import dev.kvferry.actors.engine.PeerKey;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.List;
import java.util.OptionalInt;
import java.util.function.Consumer;
import java.util.function.IntConsumer;
import org.apache.pekko.actor.typed.ActorRef;
import org.jspecify.annotations.Nullable;
import org.slf4j.Logger;

/**
 * What one actor sends to peer engines, and what it holds for peers not listed yet (they may have
 * just joined): messages, and work that needs a peer's TP size. Both are held no longer than a
 * transfer may take and never more than the terminal-id capacity, so a peer naming engines that
 * never come (bad kv_transfer_params, a typo) cannot grow them without bound. The owner hands it
 * each new directory and then calls {@link #flush}. Not thread-safe: owned by one actor.
 */
final class PeerOutbox {

  /** {@code incarnation}: the actor uid of the worker it must reach; 0: whichever is listed. */
  private record Held(
      PeerKey to, int incarnation, PeerProtocol.Message message, long heldSinceNanos) {}

  /**
   * Work that needs a peer engine's TP size. Which queue holds it says what it is: droppable work
   * goes when its transfer ends ({@code onDropped} then runs); work owed to the peer (a release,
   * an abandon) stays until it is done.
   */
  private record AwaitingTpSize(
      String engineId, String transferId, IntConsumer action, @Nullable Runnable onDropped,
      long heldSinceNanos) {}

  /** Hears each message as it is told to a worker, at once or when held ones are flushed. */
  interface Delivery {
    void told(PeerKey to, PeerProtocol.Message message, ActorRef<EngineActor.Command> worker);
  }

  private final Logger log;
  private final ConnectorSettings settings;
  private Delivery delivery = (to, message, worker) -> {};
  private final ArrayDeque<Held> held = new ArrayDeque<>();
  private final ArrayDeque<AwaitingTpSize> awaitingTpSize = new ArrayDeque<>();
  /**
   * Work owed to peers, apart from the droppable work: a dropped load's release takes no room
   * from the loads still held (each bounded by the terminal-id capacity).
   */
  private final ArrayDeque<AwaitingTpSize> owed = new ArrayDeque<>();
  private EngineDirectory directory = EngineDirectory.EMPTY;

  PeerOutbox(Logger log, ConnectorSettings settings) {
    this.log = log;
    this.settings = settings;
  }

  /** Replaces the listener that hears every message told to a worker. */
  void onDelivery(Delivery listener) {
    this.delivery = listener;
  }

  EngineDirectory directory() {
    return directory;
  }

  /** Takes a new directory and returns the one before; {@link #flush} then sends what it can. */
  EngineDirectory replaceDirectory(EngineDirectory now) {
    EngineDirectory before = directory;
    directory = now;
    return before;
  }

  /** Sends {@code message} to worker {@code tpRank} of {@code engineId}, or holds it. */
  void send(String engineId, int tpRank, PeerProtocol.Message message) {
    send(engineId, tpRank, 0, message);
  }

  /**
   * As {@link #send(String, int, PeerProtocol.Message)}, to the worker's incarnation whose actor
   * uid is {@code incarnation} (0: any): held while the directory lists another (an engine that
   * attached again: its old incarnation can stay listed for a moment after it stopped).
   */
  void send(String engineId, int tpRank, int incarnation, PeerProtocol.Message message) {
    send(new Held(new PeerKey(engineId, tpRank), incarnation, message, System.nanoTime()));
  }

  private void send(Held h) {
    var entry = directory.find(h.to().engineId(), h.to().tpRank())
        .filter(e -> h.incarnation() == 0 || e.ref().path().uid() == h.incarnation());
    if (entry.isPresent()) {
      ActorRef<EngineActor.Command> worker = entry.get().ref();
      worker.tell(h.message());
      delivery.told(h.to(), h.message(), worker);
      return;
    }
    if (System.nanoTime() - h.heldSinceNanos() > settings.transferTimeout().toNanos()) {
      log.warn("{}{} never joined; dropping {}", h.to().engineId(),
          h.incarnation() == 0 ? "" : " (worker incarnation uid " + h.incarnation() + ")",
          h.message());
      return;
    }
    if (held.size() >= settings.terminalIdCapacity()) {
      Held oldest = held.poll();
      log.warn("too many messages held for engines not listed; dropping {} for {}",
          oldest.message(), oldest.to().engineId());
    }
    log.debug("{} not listed yet; holding {}", h.to().engineId(), h.message());
    held.add(h);
  }

  /**
   * Runs {@code action} with the TP size of {@code engineId} now if it is listed, else once it is
   * (dropped when transfer {@code transferId} ends, see {@link #drop}).
   */
  void withTpSizeOf(String engineId, String transferId, IntConsumer action) {
    withTpSizeOf(engineId, transferId, action, null);
  }

  /**
   * As {@link #withTpSizeOf(String, String, IntConsumer)}; if the work is dropped unrun (its
   * transfer ended, see {@link #drop}; it waited longer than a transfer may take; it was the
   * oldest held when too much was) {@code onDropped} runs instead, once it is out of the outbox.
   */
  void withTpSizeOf(
      String engineId, String transferId, IntConsumer action, @Nullable Runnable onDropped) {
    runOrHold(new AwaitingTpSize(engineId, transferId, action, onDropped, System.nanoTime()),
        awaitingTpSize);
  }

  /**
   * Runs {@code action} with the TP size of {@code engineId} now if it is listed, else once it is,
   * whatever becomes of transfer {@code transferId}: what it sends is owed to the peer after the
   * transfer ended here (a release of the blocks P keeps for us), so {@link #drop} keeps it and
   * {@link #holdsWorkFor} does not count it.
   */
  void owedWhenListed(String engineId, String transferId, IntConsumer action) {
    runOrHold(new AwaitingTpSize(engineId, transferId, action, null, System.nanoTime()), owed);
  }

  /** Runs {@code a} if its peer is listed, else holds it in {@code queue} (its kind's). */
  private void runOrHold(AwaitingTpSize a, ArrayDeque<AwaitingTpSize> queue) {
    OptionalInt tp = PeerPlanning.tpSizeOf(directory, a.engineId());
    if (tp.isPresent()) {
      a.action().accept(tp.getAsInt());
      return;
    }
    if (System.nanoTime() - a.heldSinceNanos() > settings.transferTimeout().toNanos()) {
      log.warn("{} never joined; dropping work of transfer {}", a.engineId(), a.transferId());
      dropped(a);
      return;
    }
    log.debug("{} not listed yet; holding work that needs its TP size", a.engineId());
    AwaitingTpSize evicted = null;
    if (queue.size() >= settings.terminalIdCapacity()) {
      evicted = queue.poll();
      log.warn("too much work held for engines not listed; dropping work of transfer {} for {}",
          evicted.transferId(), evicted.engineId());
    }
    queue.add(a);
    if (evicted != null) {
      dropped(evicted); // a load's release goes to the owed queue: no cascade here
    }
  }

  /** Work dropped unrun, however: what it owes the peer (its onDropped) is held in its place. */
  private static void dropped(AwaitingTpSize a) {
    if (a.onDropped() != null) {
      a.onDropped().run();
    }
  }

  /** Whether droppable work of {@code transferId} waits for a peer's TP size. */
  boolean holdsWorkFor(String transferId) {
    for (AwaitingTpSize a : awaitingTpSize) {
      if (transferId.equals(a.transferId())) {
        return true;
      }
    }
    return false;
  }

  /**
   * Drops what is held for a transfer that ended: droppable work waiting for a peer's TP size
   * (each one's {@code onDropped} runs), and our blocks announced to P workers not listed yet
   * ({@code blocksDropped} hears each such worker: it can never write now, and was never told of
   * the transfer). Work owed to the peer stays. The callbacks run once the dropped entries are
   * out of the outbox, so they may send through it.
   */
  void drop(String transferId, Consumer<PeerKey> blocksDropped) {
    List<AwaitingTpSize> droppedWork = new ArrayList<>();
    awaitingTpSize.removeIf(a -> {
      if (transferId.equals(a.transferId())) {
        droppedWork.add(a);
        return true;
      }
      return false;
    });
    List<PeerKey> dropped = new ArrayList<>();
    held.removeIf(h -> {
      if (h.message() instanceof PeerProtocol.RemoteBlocks b && b.transferId().equals(transferId)) {
        dropped.add(h.to());
        return true;
      }
      return false;
    });
    droppedWork.forEach(PeerOutbox::dropped);
    dropped.forEach(blocksDropped);
  }

  /** After a directory change: runs the work whose peer is listed now, then sends what was held. */
  void flush() {
    List<AwaitingTpSize> owedNow = new ArrayList<>(owed);
    List<AwaitingTpSize> droppableNow = new ArrayList<>(awaitingTpSize);
    owed.clear();
    awaitingTpSize.clear();
    owedNow.forEach(a -> runOrHold(a, owed));
    droppableNow.forEach(a -> runOrHold(a, awaitingTpSize));
    List<Held> waiting = new ArrayList<>(held);
    held.clear();
    waiting.forEach(this::send);
  }
}
