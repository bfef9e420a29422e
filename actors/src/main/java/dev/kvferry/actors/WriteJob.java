package dev.kvferry.actors;

import dev.kvferry.actors.connector.ReqMeta;
import dev.kvferry.actors.engine.AgentMetadata;
import dev.kvferry.actors.engine.PeerKey;
import dev.kvferry.actors.engine.EngineDirectory;
import dev.kvferry.rdma.TransferBatch;
import dev.kvferry.rdma.TransferStatus;
import dev.kvferry.rdma.cuda.CudaEvent;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.atomic.AtomicBoolean;
import org.agrona.collections.Int2ObjectHashMap;
import org.agrona.collections.IntArrayList;
import org.apache.pekko.actor.typed.ActorRef;
import org.jspecify.annotations.Nullable;

/**
 * Everything one P worker knows about one transfer's writes (WRITE mode), owned by its {@link
 * WriterActor}. It begins when the first of two things arrives, the engine's first saved layer or
 * D's blocks, and learns the rest as it comes: D's TP size (so which D workers to write to), each
 * D worker's blocks and metadata, the layers whose compute event fired, the sealed layer count.
 */
final class WriteJob {

  /** One D worker this P worker writes a request's KV into. */
  static final class Target {
    final int tpRank;
    int @Nullable [] remoteBlockIds;
    @Nullable AgentMetadata peer;
    @Nullable ActorRef<EngineActor.Command> decodeRef;
    @Nullable TransferBatch plan;
    /** How many of the job's fired layers have been issued to this target. */
    int issued;
    boolean handshakeRequested;
    /**
     * The uid of the D worker incarnation that sent its blocks (0: not known, or any): only its
     * metadata is written through.
     */
    int incarnation;
    /** D's done word for this target, from its RemoteBlocks; null: none. */
    PeerProtocol.@Nullable DoneWord doneWord;
    /** With a done word: each issued layer's submission (copies queued, not yet done). */
    final List<CompletableFuture<TransferStatus>> submitted = new ArrayList<>();
    boolean doneWordQueued;

    Target(int tpRank) {
      this.tpRank = tpRank;
    }
  }

  final String transferId;
  final long startedMs = System.currentTimeMillis();
  /** From D's blocks until the engine saves a layer; the engine's own after. */
  String requestId;
  String decodeEngineId;
  /** Ours; null until the engine saves a layer (then the job is "saved"). */
  int @Nullable [] localBlockIds;
  /**
   * D's workers to write into, once D's TP size is known: with equal TP sizes the worker of our
   * rank; otherwise those whose heads overlap ours (MLA: maybe none).
   */
  int @Nullable [] targetRanks;
  /** By D TP rank; remote blocks may come before the targets are known. */
  final Int2ObjectHashMap<Target> targets = new Int2ObjectHashMap<>();
  /** Layers whose compute event fired, in firing order; each target issues them in turn. */
  final IntArrayList firedLayers = new IntArrayList();
  /** Layers whose copies wait for their compute event on the GPU, not here. */
  final Int2ObjectHashMap<CudaEvent> gpuEvents = new Int2ObjectHashMap<>();
  int inFlight;
  int completed;
  /** Layers per target, once sealed after the forward pass; -1 until then. */
  int expected = -1;
  long bytes;
  boolean probeRequested;
  /** Why the job is ending; non-null: no write starts, the ending waits for inFlight == 0. */
  @Nullable String failure;
  /** Seen by submissions still queued on the io pool: they skip their copies. */
  final AtomicBoolean cancelled = new AtomicBoolean();

  WriteJob(String transferId, String requestId, String decodeEngineId) {
    this.transferId = transferId;
    this.requestId = requestId;
    this.decodeEngineId = decodeEngineId;
  }

  /** Layer {@code layer}'s copies wait on the GPU for {@code event}: ready as far as we care. */
  void firedOnGpu(int layer, CudaEvent event) {
    gpuEvents.put(layer, event);
    firedLayers.addInt(layer);
  }

  /** Layers saved but held for a later layer's event (save-layers together), in save order. */
  private final IntArrayList heldOnGpu = new IntArrayList();
  /** The event of the last layer held. */
  private @Nullable CudaEvent heldEvent;

  /** Holds layer {@code layer} (its copies not queued yet) until a later layer's event. */
  void holdOnGpu(int layer, CudaEvent event) {
    heldOnGpu.addInt(layer);
    heldEvent = event;
  }

  /**
   * Layers held so far go behind {@code event}, recorded after theirs on the engine's in-order
   * stream: their copies then wait for it, one GPU hand-over for all of them.
   */
  void releaseHeldBehind(CudaEvent event) {
    for (int i = 0; i < heldOnGpu.size(); i++) {
      firedOnGpu(heldOnGpu.getInt(i), event);
    }
    heldOnGpu.clear();
    heldEvent = null;
  }

  /** Releases held layers behind the last held one's event; whether there were any. */
  boolean releaseHeld() {
    CudaEvent event = heldEvent;
    if (event == null) {
      return false;
    }
    releaseHeldBehind(event);
    return true;
  }

  /** One layer write to one target completed, moving {@code bytesMoved}. */
  void written(long bytesMoved) {
    completed++;
    bytes += bytesMoved;
  }

  /** The engine handed us the request to save: its own ids win over what D's message said. */
  void save(ReqMeta r) {
    if (localBlockIds == null) {
      requestId = r.requestId();
      decodeEngineId = r.remoteEngineId();
      localBlockIds = r.localBlockIds();
    }
  }

  /**
   * D's worker {@code b.decodeTpRank()} sent its blocks (and, where {@code storesDoneWords}, a
   * usable done word is kept); false if that worker sent them already.
   */
  boolean remoteBlocks(PeerProtocol.RemoteBlocks b, boolean storesDoneWords) {
    Target t = target(b.decodeTpRank());
    if (t.remoteBlockIds != null) {
      return false;
    }
    t.remoteBlockIds = b.blockIds();
    t.incarnation = b.decodeWorkerUid();
    if (t.incarnation != 0) {
      if (t.decodeRef != null && t.decodeRef.path().uid() != t.incarnation) {
        // Metadata came (through a TP-size probe's handshake) from an incarnation other than
        // the one whose blocks these are: not written through.
        t.peer = null;
        t.decodeRef = null;
        t.plan = null;
      }
      if (t.peer == null) {
        t.handshakeRequested = false; // a fetch asked before may answer for another incarnation
      }
    }
    PeerProtocol.DoneWord word = b.doneWord();
    if (word != null && word.usable() && storesDoneWords) {
      t.doneWord = word;
    }
    return true;
  }

  boolean saved() {
    return localBlockIds != null;
  }

  Target target(int tpRank) {
    Target t = targets.get(tpRank);
    if (t == null) {
      t = new Target(tpRank);
      targets.put(tpRank, t);
    }
    return t;
  }

  boolean isTarget(int tpRank) {
    int[] ranks = targetRanks;
    if (ranks == null) {
      return false;
    }
    for (int r : ranks) {
      if (r == tpRank) {
        return true;
      }
    }
    return false;
  }

  /** Whether D's worker {@code tpRank}'s handshake concerns it (any, while targets are unknown). */
  boolean awaitsHandshake(int tpRank) {
    return targetRanks == null || isTarget(tpRank);
  }

  /** Only an engine that was listed and is gone has left; one not listed yet may still join. */
  boolean decodeEngineLeft(EngineDirectory before, EngineDirectory now) {
    return before.contains(decodeEngineId) && !now.contains(decodeEngineId);
  }

  /** Whether every layer was written to every target and nothing is in flight. */
  boolean allWritten() {
    int[] ranks = targetRanks;
    return failure == null && expected >= 0 && ranks != null
        && completed >= (long) expected * ranks.length && inFlight == 0;
  }

  /** Forgets D workers that sent blocks but are not targets (their heads do not overlap ours). */
  IntArrayList dropNonTargets() {
    IntArrayList strangers = new IntArrayList();
    for (Target t : targets.values()) {
      if (!isTarget(t.tpRank)) {
        strangers.addInt(t.tpRank);
      }
    }
    strangers.forEachInt(targets::remove);
    return strangers;
  }

  /** How the write looks to /kvferry/transfers ("writing"). */
  TransferView view(long nowMs) {
    return new TransferView(
        requestId, transferId, "writing", decodeEngineId, nowMs - startedMs,
        new WriteProgress(firedLayers.size(), completed, inFlight));
  }

  /** Why writing {@code layer} to D's worker {@code decodeTpRank} failed. */
  String writeFailed(int ownTpRank, int decodeTpRank, int layer, @Nullable String why) {
    return "writing layer " + layer + " of transfer " + transferId + " to "
        + decodeWorker(decodeTpRank, ownTpRank) + " failed: " + why;
  }

  /** Why the job fails at the defer timeout. */
  String deferExpired(int ownTpRank, Duration deferTimeout) {
    return "transfer " + transferId + " still waits for " + missing(ownTpRank) + " after "
        + deferTimeout.toMillis() + " ms";
  }

  /** D's worker of {@code rank}, named by its engine alone when it has our rank. */
  private String decodeWorker(int rank, int ownTpRank) {
    return rank == ownTpRank ? decodeEngineId : new PeerKey(decodeEngineId, rank).toString();
  }

  /** What the job still waits for, for the defer timeout's message. */
  private String missing(int ownTpRank) {
    int[] ranks = targetRanks;
    if (ranks == null) {
      for (Target t : targets.values()) {
        if (t.remoteBlockIds != null) {
          return "the TP size of " + decodeEngineId;
        }
      }
      return "remote blocks from " + decodeEngineId;
    }
    for (int rank : ranks) {
      Target t = targets.get(rank);
      String who = decodeWorker(rank, ownTpRank);
      if (t == null || t.remoteBlockIds == null) {
        return "remote blocks from " + who;
      }
      if (t.peer == null) {
        return "metadata of " + who;
      }
    }
    return "layer events or seal";
  }
}
