package dev.kvferry.actors;

import dev.kvferry.actors.connector.ReqMeta;
import dev.kvferry.actors.engine.EngineDirectory;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import org.agrona.collections.IntHashSet;
import org.apache.pekko.actor.typed.ActorRef;
import org.jspecify.annotations.Nullable;

/**
 * A receive a {@link ReceiverActor} began and has not ended: which P workers may still write into
 * its blocks, what each was told, and why it is ending. Used from the receiver's thread only.
 */
final class IncomingReceive {
  final ReqMeta request;
  /** P workers told our blocks that have not finished; null until P's TP size is known. */
  @Nullable IntHashSet mayWrite;
  /** Why it is ending; non-null: P was asked to abandon and we wait for mayWrite to empty. */
  @Nullable String failure;
  /**
   * What each P worker was told, in the order of {@link #tellers}' ranks (each message carries
   * that worker's own done word): told again to a worker's new incarnation. Empty until told.
   */
  private PeerProtocol.RemoteBlocks[] told = new PeerProtocol.RemoteBlocks[0];
  private int[] tellers = new int[0];
  /** The incarnation each P worker's blocks went to, by its TP rank. */
  final Map<Integer, ActorRef<EngineActor.Command>> toldWorkers = new HashMap<>(2);

  IncomingReceive(ReqMeta request) {
    this.request = request;
  }

  String transferId() {
    return request.transferId();
  }

  boolean nobodyMayWrite() {
    return mayWrite == null || mayWrite.isEmpty();
  }

  /** P workers {@code ranks} are told {@code blocks} (same order); all of them may write. */
  void told(int[] ranks, PeerProtocol.RemoteBlocks[] blocks) {
    IntHashSet due = new IntHashSet(ranks.length);
    for (int rank : ranks) {
      due.add(rank);
    }
    mayWrite = due;
    tellers = ranks.clone();
    told = blocks.clone();
  }

  /** What P worker {@code rank} was told, or null if it was told nothing. */
  PeerProtocol.@Nullable RemoteBlocks blocksFor(int rank) {
    for (int i = 0; i < tellers.length; i++) {
      if (tellers[i] == rank) {
        return told[i];
      }
    }
    return null;
  }

  /** The P workers that may still write, as a copy (the caller may end them one by one). */
  int[] dueRanks() {
    IntHashSet due = mayWrite;
    if (due == null) {
      return new int[0];
    }
    int[] ranks = new int[due.size()];
    int n = 0;
    for (IntHashSet.IntIterator it = due.iterator(); it.hasNext(); ) {
      ranks[n++] = it.nextValue();
    }
    return ranks;
  }

  /**
   * P workers that were told our blocks, may still write, and are no longer the worker {@code
   * now} routes their rank to (stopped: their engine detached, maybe to attach again).
   */
  List<Integer> stoppedTellers(EngineDirectory now) {
    List<Integer> gone = new ArrayList<>();
    IntHashSet due = mayWrite;
    if (due == null) {
      return gone;
    }
    String p = request.remoteEngineId();
    toldWorkers.forEach((rank, worker) -> {
      boolean stillRouted = now.find(p, rank).map(e -> e.ref().equals(worker)).orElse(false);
      if (due.contains(rank) && !stillRouted) {
        gone.add(rank);
      }
    });
    return gone;
  }
}
