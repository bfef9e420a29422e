package dev.kvferry.actors.connector;

import dev.kvferry.actors.EngineActor;
import dev.kvferry.actors.ReadStamps;
import dev.kvferry.actors.engine.BoundedMap;
import dev.kvferry.actors.engine.ConnectorSettings;
import java.time.Clock;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Objects;
import org.apache.pekko.actor.typed.ActorRef;

/**
 * Scheduler side of the connector, one per DP engine: pure bookkeeping called from the engine's
 * scheduler loop. It never blocks; the one thing it sends (D's remote blocks in WRITE mode) is a
 * message to the local workers. Not thread-safe, like the seed's MoRIIOConnectorScheduler.
 */
public final class ConnectorScheduler {

  private final Role role;
  private final TransferMode mode;
  private final String engineId;
  private final int dpRank;
  private final int blockSize;
  private final List<ActorRef<EngineActor.Command>> localWorkers;
  private final ConnectorSettings settings;
  private final Clock clock;

  private final Map<String, Pending> reqsNeedRecv = new LinkedHashMap<>();
  private final Map<String, Pending> reqsNeedSave = new LinkedHashMap<>();
  private final Map<String, Pending> reqsNeedPendingSave = new HashMap<>();
  private final List<ConnectorMetadata.PendingSend> reqsNeedSend = new ArrayList<>();
  /**
   * Requests whose transfer the workers hold blocks of: P, WRITE, handed to the workers to save; D,
   * scheduled with a transfer. If one of them is aborted its free is delayed until the workers
   * report it, since a copy may still touch its blocks (DESIGN.md section 3, block lifetime).
   */
  private final java.util.Set<String> lentToTransfer = new java.util.HashSet<>();
  /**
   * P, READ: the request each transfer id kept blocks for a reader under (bounded, oldest out).
   * The workers refuse an id used again and free its blocks at once: no D may be handed those.
   */
  private final BoundedMap<String, String> keptForReaders;

  /** A request with blocks; {@code externalTokens}: the tokens D loads into them (READ). */
  private record Pending(ConnectorRequest request, int[] blockIds, int externalTokens) {
    Pending(ConnectorRequest request, int[] blockIds) {
      this(request, blockIds, 0);
    }
  }

  /**
   * @param localWorkers this engine's workers, one per TP rank, in rank order; D's remote-block
   *     announcements go to each
   */
  public ConnectorScheduler(
      Role role,
      TransferMode mode,
      String engineId,
      int dpRank,
      int blockSize,
      List<ActorRef<EngineActor.Command>> localWorkers,
      ConnectorSettings settings,
      Clock clock) {
    if (blockSize < 1) {
      throw new IllegalArgumentException("block size must be positive, got " + blockSize);
    }
    this.role = role;
    this.mode = mode;
    this.engineId = engineId;
    this.dpRank = dpRank;
    this.blockSize = blockSize;
    this.localWorkers = List.copyOf(localWorkers);
    this.settings = settings;
    this.clock = clock;
    this.keptForReaders = new BoundedMap<>(settings.terminalIdCapacity());
  }

  /** How many prompt tokens the remote side provides, and whether they arrive asynchronously. */
  /** Whether P writes (WRITE) or D reads (READ). */
  public TransferMode mode() {
    return mode;
  }

  public MatchedTokens numNewMatchedTokens(ConnectorRequest request, int numComputedTokens) {
    KvTransferParams p = request.params();
    if (role == Role.PREFILL || p == null || !p.doRemotePrefill()) {
      return MatchedTokens.NONE;
    }
    if (mode == TransferMode.WRITE) {
      // P writes all of it while D waits: loaded asynchronously between steps.
      return new MatchedTokens(Math.max(0, request.numPromptTokens() - numComputedTokens), true);
    }
    // READ: the last prompt token is recomputed on D to produce the first output token. Loaded
    // asynchronously: the engine waits for getFinished (or per layer, waitForLayerLoad) before it
    // runs over these tokens; a synchronous load would let it compute while reads still land.
    return new MatchedTokens(Math.max(0, request.numPromptTokens() - 1 - numComputedTokens), true);
  }

  /** Called once the engine allocated {@code blockIds} for the request. */
  public void updateStateAfterAlloc(
      ConnectorRequest request, int[] blockIds, int numExternalTokens) {
    KvTransferParams p = request.params();
    if (p == null) {
      return;
    }
    if (p.doRemoteDecode()) {
      // A second allocation is a request preempted and scheduled again: vLLM freed the blocks it
      // had, and these are all of its blocks now.
      reqsNeedPendingSave.remove(request.requestId());
      reqsNeedSave.put(request.requestId(), new Pending(request, blockIds.clone()));
    }
    if (p.doRemotePrefill()) {
      if (mode == TransferMode.READ) {
        Pending recv = new Pending(request, blockIds.clone(), numExternalTokens);
        if (settings.readsAtAdmission()) {
          startReadsNow(recv);
        } else {
          reqsNeedRecv.put(request.requestId(), recv);
        }
      } else {
        ReqMeta meta =
            new ReqMeta(
                request.requestId(), p.transferId(), blockIds.clone(), new int[0], p.remoteEngineId(),
                p.remoteDpRank());
        for (ActorRef<EngineActor.Command> w : localWorkers) {
          w.tell(new EngineActor.AnnounceRemoteBlocks(meta));
        }
        lentToTransfer.add(request.requestId());
      }
      // Only one KV transfer per request.
      request.setParams(p.withDoRemotePrefill(false));
    }
  }

  /** This step's metadata for the workers; clears what it hands over. */
  public ConnectorMetadata buildConnectorMeta(SchedulerOutput output) {
    List<ReqMeta> save = new ArrayList<>();
    List<ReqMeta> recv = new ArrayList<>();
    if (role == Role.PREFILL && mode == TransferMode.WRITE) {
      // Chunked prefill: a request is saved only when its final chunk is scheduled.
      for (SchedulerOutput.CachedRequest c : output.scheduledCachedReqs()) {
        Pending pending = reqsNeedPendingSave.get(c.requestId());
        if (pending == null) {
          continue;
        }
        // vLLM passes no new block ids when the chunk fits in the blocks it has: none added.
        int[] added = c.newBlockIds() == null ? new int[0] : c.newBlockIds();
        // Preempted and scheduled again: vLLM freed the old blocks and lists all the new ones.
        int[] blocks = c.resumed() ? added : concat(pending.blockIds(), added);
        nextChunk(pending, blocks, c.computedTokensAfterStep(), save);
      }
      // A newer vLLM schedules a preempted request again as a new one, with all its blocks.
      for (SchedulerOutput.NewRequest n : output.scheduledNewReqs()) {
        Pending pending = reqsNeedPendingSave.get(n.requestId());
        if (pending != null) {
          nextChunk(pending, n.blockIds(), n.computedTokensAfterStep(), save);
        }
      }
    }
    for (Pending pr : reqsNeedRecv.values()) {
      recv.add(lendToReads(pr));
    }
    Map<String, Integer> computedAfterStep = new HashMap<>();
    for (SchedulerOutput.NewRequest n : output.scheduledNewReqs()) {
      computedAfterStep.put(n.requestId(), n.computedTokensAfterStep());
    }
    for (SchedulerOutput.CachedRequest c : output.scheduledCachedReqs()) {
      computedAfterStep.putIfAbsent(c.requestId(), c.computedTokensAfterStep()); // resumed ones
    }
    for (Pending pr : reqsNeedSave.values()) {
      int computed = computedAfterStep.getOrDefault(pr.request().requestId(), -1);
      if (!isLastChunk(pr.request(), pr.blockIds(), computed)) {
        reqsNeedPendingSave.put(pr.request().requestId(), pr); // not the last chunk yet
        continue;
      }
      if (mode == TransferMode.WRITE) {
        save.add(toSaveMeta(pr.request(), pr.blockIds()));
      }
    }
    for (ReqMeta r : save) {
      lentToTransfer.add(r.requestId());
    }
    List<ConnectorMetadata.PendingSend> send = List.copyOf(reqsNeedSend);
    reqsNeedRecv.clear();
    reqsNeedSave.clear();
    reqsNeedSend.clear();
    return new ConnectorMetadata(save, recv, send);
  }

  /** P, WRITE: a later chunk of a chunked prefill; its last one is saved this step. */
  private void nextChunk(Pending pending, int[] blocks, int computedAfterStep, List<ReqMeta> save) {
    String id = pending.request().requestId();
    if (isLastChunk(pending.request(), blocks, computedAfterStep)) {
      reqsNeedPendingSave.remove(id);
      save.add(toSaveMeta(pending.request(), blocks));
    } else {
      reqsNeedPendingSave.put(id, new Pending(pending.request(), blocks));
    }
  }

  /**
   * D, READ: the load of {@code pr} as the workers get it. Its blocks (if any) are lent from now
   * on: the workers read into them.
   */
  private ReqMeta lendToReads(Pending pr) {
    // Loads are queued only for requests with params, which are replaced, never cleared.
    KvTransferParams p = Objects.requireNonNull(pr.request().params());
    if (pr.blockIds().length > 0) {
      lentToTransfer.add(pr.request().requestId());
    }
    return new ReqMeta(
        pr.request().requestId(), p.transferId(), pr.blockIds(),
        blocksBeforeLastToken(p.remoteBlockIds(), pr.request().numPromptTokens(),
            pr.blockIds().length, pr.externalTokens()),
        p.remoteEngineId(), p.remoteDpRank(), p.remoteWorkerUids());
  }

  /**
   * D, READ, {@link ConnectorSettings#readsAtAdmission}: hands the load to the workers now rather
   * than with the next step's metadata, so the reads run while the engine finishes scheduling and
   * starts its step (about 0.45 ms on the GPU host, docs/gpu.md). The engine loads asynchronously
   * and runs nothing over these blocks before {@code get_finished} reports them received, so no
   * step waits per layer for them. Without blocks (a full prefix hit) it tells P to free, as the
   * step's metadata would.
   */
  private void startReadsNow(Pending pr) {
    ReqMeta load = lendToReads(pr);
    if (load.localBlockIds().length > 0) {
      ReadStamps.mark(load.transferId(), ReadStamps.Stage.START_LOAD);
    }
    handToWorkers(load);
  }

  /** Hands one load to every local worker now, outside a step's metadata. */
  private void handToWorkers(ReqMeta load) {
    ConnectorMetadata meta = new ConnectorMetadata(List.of(), List.of(load), List.of());
    for (ActorRef<EngineActor.Command> w : localWorkers) {
      w.tell(new EngineActor.StartLoad(meta));
    }
  }

  /**
   * P's blocks for D to read. D loads the prompt's tokens before the last ({@code loadedTokens}
   * after a prefix hit of {@code n - 1 - loadedTokens}) and computes the last itself. An engine
   * that allocated blocks for just those tokens (vLLM) has, when they end on a block boundary, one
   * block fewer than P's list minus the hit: P's last block holds only the last token. It is
   * dropped, so that cutting P's list to its tail for a prefix hit on D (as the seed does) lines
   * P's blocks up with D's. Seen with a real model (docs/gpu.md): prompts of 97, 241 or 417 tokens
   * (16-token blocks) were read one block off. Left as it is when D allocated blocks for the whole
   * prompt, or when P's list is not as long as this engine's block size gives for the prompt (P's
   * block size differs: the planner maps tokens).
   */
  int[] blocksBeforeLastToken(
      int[] remoteBlockIds, int numPromptTokens, int localBlocks, int loadedTokens) {
    long hit = (long) numPromptTokens - 1 - loadedTokens;
    if (numPromptTokens < 1 || loadedTokens < 1 || hit < 0 || hit % blockSize != 0) {
      return remoteBlockIds;
    }
    long all = ((long) numPromptTokens + blockSize - 1) / blockSize;
    long beforeLast = ((long) numPromptTokens - 1 + blockSize - 1) / blockSize;
    if (remoteBlockIds.length != all || beforeLast >= all
        || localBlocks != beforeLast - hit / blockSize) {
      return remoteBlockIds;
    }
    return java.util.Arrays.copyOf(remoteBlockIds, (int) beforeLast);
  }

  /**
   * Whether this step computes the request's last prompt tokens. The seed tests allocated blocks x
   * block size >= prompt, which holds one step early when a chunk ends inside a block (blocks are
   * allocated for the partial block): the last tokens would then be written before they are
   * computed. The engine's computed-token count is exact; the block test is the fallback.
   */
  private boolean isLastChunk(ConnectorRequest r, int[] blocks, int computedAfterStep) {
    if (computedAfterStep >= 0) {
      return computedAfterStep >= r.numPromptTokens();
    }
    return (long) blocks.length * blockSize >= r.numPromptTokens();
  }

  private static ReqMeta toSaveMeta(ConnectorRequest r, int[] blocks) {
    KvTransferParams p = Objects.requireNonNull(r.params()); // saved only with params
    return new ReqMeta(
        r.requestId(), p.transferId(), blocks, new int[0], p.remoteEngineId(), p.remoteDpRank());
  }

  /**
   * The request finished on this engine: whether to keep its blocks until the connector reports it
   * done sending, and (P) the params D needs.
   */
  public FinishDecision requestFinished(ConnectorRequest request, int[] blockIds) {
    KvTransferParams p = request.params();
    reqsNeedPendingSave.remove(request.requestId());
    boolean lent = lentToTransfer.remove(request.requestId());
    if (p == null) {
      return FinishDecision.FREE_NOW;
    }
    boolean aborted = request.status() == ConnectorRequest.Status.FINISHED_ABORTED;
    if (role == Role.DECODE && !p.doRemotePrefill()) {
      Pending notHandedOver = reqsNeedRecv.get(request.requestId());
      if (notHandedOver != null) {
        // Scheduled but not handed to the workers yet: nothing reads into its blocks. Read
        // nothing; tell P to free its blocks.
        tellPrefillToFree(request, p);
        return FinishDecision.FREE_NOW;
      }
      if (aborted && lent) {
        // Its transfer may still be copying into its blocks: end it like a timeout (P is asked
        // to abandon) and free once the workers report the request.
        for (ActorRef<EngineActor.Command> w : localWorkers) {
          w.tell(
              new EngineActor.AbortReceive(
                  request.requestId(), p.transferId(),
                  "request " + request.requestId() + " aborted on decode engine " + engineId));
        }
        return new FinishDecision(true, null);
      }
    }
    if (p.doRemotePrefill()) {
      // Still set: the request was aborted before it was scheduled. Tell P to free its blocks
      // (the seed does this in READ mode; in WRITE mode it also stops P waiting for our blocks).
      tellPrefillToFree(request, p);
      request.setParams(p.withDoRemotePrefill(false));
      return FinishDecision.FREE_NOW;
    }
    if (!p.doRemoteDecode()) {
      return FinishDecision.FREE_NOW;
    }
    if (aborted) {
      // P gave up on the request: D must not wait for writes that will never come.
      for (ActorRef<EngineActor.Command> w : localWorkers) {
        w.tell(
            new EngineActor.AbortTransfer(
                request.requestId(), p.transferId(), p.remoteEngineId(),
                "request " + request.requestId() + " aborted on prefill engine " + engineId));
      }
    }
    if (request.status() != ConnectorRequest.Status.FINISHED_LENGTH_CAPPED) {
      // Aborted, or stopped (P sampled a stop token as its one token): D gets no params, as in
      // the seed. Handed to the workers to save (WRITE), its writes may still read its blocks:
      // freed when the workers report it done sending (the seed freed a stopped one at once,
      // letting a reused block's new contents reach D). Otherwise nothing touches them.
      return lent && mode == TransferMode.WRITE
          ? new FinishDecision(true, null)
          : FinishDecision.FREE_NOW;
    }
    boolean delay = blockIds.length > 0; // a prompt shorter than a block moves nothing
    String keptFor = keptForReaders.get(p.transferId());
    if (delay && mode == TransferMode.READ && keptFor != null
        && !keptFor.equals(request.requestId())) {
      return FinishDecision.FREE_NOW; // no params: the request fails at D's side, read nothing
    }
    if (delay && mode == TransferMode.READ) {
      keptForReaders.put(p.transferId(), request.requestId());
      long deadline = clock.millis() + settings.readAbortTimeout().toMillis();
      reqsNeedSend.add(
          new ConnectorMetadata.PendingSend(
              request.requestId(), p.transferId(), deadline, p.remoteEngineId()));
    }
    // By TP rank (the workers are in rank order): D reads from these incarnations only.
    int[] uids = mode == TransferMode.READ
        ? localWorkers.stream().mapToInt(w -> w.path().uid()).toArray()
        : new int[0];
    KvTransferParams forDecode =
        new KvTransferParams(
            true, false, p.transferId(), engineId, dpRank, blockIds.clone(), "", 0,
            Math.max(1, localWorkers.size()), uids);
    return new FinishDecision(delay, forDecode);
  }

  /**
   * Tells P, through the workers, that this request reads nothing, so P frees the blocks it keeps
   * for it. At once, not with the next step's metadata: the engine may have no next step (nothing
   * else to run), and P would hold the blocks until its abort timeout.
   */
  private void tellPrefillToFree(ConnectorRequest request, KvTransferParams p) {
    reqsNeedRecv.remove(request.requestId());
    handToWorkers(new ReqMeta(request.requestId(), p.transferId(), new int[0],
        p.remoteBlockIds(), p.remoteEngineId(), p.remoteDpRank(), p.remoteWorkerUids()));
  }

  private static int[] concat(int[] a, int[] b) {
    int[] out = Arrays.copyOf(a, a.length + b.length);
    System.arraycopy(b, 0, out, a.length, b.length);
    return out;
  }
}
