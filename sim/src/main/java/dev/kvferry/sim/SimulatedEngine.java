package dev.kvferry.sim;

import dev.kvferry.engine.RequestSpec;
import dev.kvferry.engine.EngineService;
import dev.kvferry.actors.connector.ConnectorMetadata;
import dev.kvferry.actors.connector.ConnectorRequest;
import dev.kvferry.actors.connector.ConnectorScheduler;
import dev.kvferry.actors.connector.ConnectorWorker;
import dev.kvferry.actors.connector.FinishDecision;
import dev.kvferry.actors.connector.Finished;
import dev.kvferry.actors.connector.KvTransferParams;
import dev.kvferry.actors.connector.LayerEvent;
import dev.kvferry.actors.connector.MatchedTokens;
import dev.kvferry.actors.connector.Role;
import dev.kvferry.actors.connector.SchedulerOutput;
import dev.kvferry.actors.connector.TransferMode;
import dev.kvferry.actors.plan.KvCacheGeometry;
import dev.kvferry.rdma.MemoryRegion;
import dev.kvferry.rdma.cuda.CudaException;
import dev.kvferry.engine.EngineService.Outcome;
import dev.kvferry.engine.EngineService.Outcome.Status;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collections;
import java.util.HashMap;
import java.util.IdentityHashMap;
import java.util.Iterator;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.locks.LockSupport;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;
import org.jspecify.annotations.Nullable;

/**
 * What a vLLM-like engine does around the connector: a paged KV cache with a block allocator, a
 * scheduler loop with chunked prefill, a per-layer "forward" that fills the scheduled tokens' K
 * and V with {@link KvPattern} and hands the connector the layer's event, and on D the path that
 * allocates, waits for the KV, verifies every byte and frees. The cache is host memory filled by
 * the CPU or GPU memory filled by kernels ({@link SimKvCache}); the loop is the same. Runs on its
 * own thread, as an engine's loop would; one engine per instance, with one worker per TP rank:
 * each rank's cache holds its share of the KV heads (MLA: the whole latent), and a request's
 * transfer is over once every rank reports it, as vLLM aggregates its workers' finished sets.
 */
public final class SimulatedEngine implements AutoCloseable {

  private static final Logger log = LoggerFactory.getLogger(SimulatedEngine.class);

  private final Role role;
  private final String engineId;
  private final KvCacheGeometry geometry;
  private final ConnectorScheduler scheduler;
  private final List<ConnectorWorker> workers;
  private final BlockAllocator allocator;
  private final SimKvCache cache;
  private final int layerCount;
  /** Per request id, how many ranks reported it ended, and the first failure. */
  private final Map<String, RankReports> reports = new HashMap<>();
  private final int tokensPerStep;
  private final LinkedBlockingQueue<EngineService.Submit> inbox = new LinkedBlockingQueue<>();
  private final Thread loop;
  private final LayerListener layerListener;
  private volatile boolean running = true;
  /** Why the engine stopped serving (its GPU failed), or null while it serves. */
  private volatile @Nullable String stoppedBecause;
  private volatile int inFlight;

  /** Told on the engine's thread each time the forward pass fires a layer's event (benchmarks). */
  @FunctionalInterface
  public interface LayerListener {
    /**
     * @param layer the layer whose event fired
     * @param layers layers in the model; {@code layer == layers - 1} is the step's last
     * @param firedNanos {@link System#nanoTime()} once the last rank's event was recorded (host:
     *     fired), before the connector was handed it
     */
    void layerFired(int layer, int layers, long firedNanos);

    LayerListener NONE = (layer, layers, firedNanos) -> {};
  }

  /** Requests waiting to be scheduled (P and D) or prefilling (P), in arrival order. */
  private final LinkedHashMap<String, SimRequest> waiting = new LinkedHashMap<>();
  /** P: prefilled, blocks kept until done sending. D: waiting for the KV. */
  private final Map<String, SimRequest> transferring = new HashMap<>();
  /** D: KV received, being checked (on a GPU the check runs behind the loop's back). */
  private final List<PendingCheck> checking = new ArrayList<>();
  /** Work to do once the cache's queued work has reached a fence, in fence order. */
  private final ArrayDeque<AfterFence> afterFence = new ArrayDeque<>();

  private record PendingCheck(SimRequest request, SimKvCache.Check check, long transferNanos) {}

  private record AfterFence(SimKvCache.Fence fence, Runnable action) {}

  private static final class RankReports {
    int count;
    @Nullable String failure;
  }

  private static final class SimRequest {
    final EngineService.Submit submit;
    final ConnectorRequest request;
    int[] blocks = new int[0];
    int computed;
    int chunkFrom;
    int chunkTo;
    int cachedBlocks;
    long transferStartNanos;

    SimRequest(EngineService.Submit submit) {
      this.submit = submit;
      this.request =
          new ConnectorRequest(
              submit.spec().requestId(), submit.spec().promptTokens(), submit.params());
    }

    String id() {
      return request.requestId();
    }
  }

  /**
   * One worker, its cache in host memory.
   *
   * @param layerRegions the worker's registered layer regions (host memory, under 2 GiB each)
   * @param tokensPerStep prefill token budget per step: longer prompts are chunked
   */
  public SimulatedEngine(
      Role role,
      String engineId,
      KvCacheGeometry geometry,
      List<MemoryRegion> layerRegions,
      ConnectorScheduler scheduler,
      ConnectorWorker worker,
      int tokensPerStep,
      long seed) {
    this(role, engineId, geometry, layerRegions, scheduler, worker, tokensPerStep, seed,
        LayerListener.NONE);
  }

  /** One worker, telling {@code layerListener} when each layer's event fires (benchmarks). */
  public SimulatedEngine(
      Role role,
      String engineId,
      KvCacheGeometry geometry,
      List<MemoryRegion> layerRegions,
      ConnectorScheduler scheduler,
      ConnectorWorker worker,
      int tokensPerStep,
      long seed,
      LayerListener layerListener) {
    this(role, engineId, geometry, new HostKvCache(geometry, List.of(layerRegions)), scheduler,
        List.of(worker), tokensPerStep, seed, layerListener);
  }

  /**
   * An engine with one worker per TP rank over {@code cache} (host or GPU), which holds one set of
   * layers per worker. The caller closes the cache after the engine.
   *
   * @param geometry one rank's geometry: its kvHeads are the rank's share of the heads
   * @param workers per TP rank (in rank order), its worker
   * @param layerListener told when each layer's events have fired on every rank
   */
  public SimulatedEngine(
      Role role,
      String engineId,
      KvCacheGeometry geometry,
      SimKvCache cache,
      ConnectorScheduler scheduler,
      List<ConnectorWorker> workers,
      int tokensPerStep,
      long seed,
      LayerListener layerListener) {
    if (cache.ranks() != workers.size() || workers.isEmpty()) {
      throw new IllegalArgumentException(
          "one set of cache layers per worker: " + cache.ranks() + " sets, " + workers.size()
              + " workers");
    }
    this.layerListener = layerListener;
    this.role = role;
    this.engineId = engineId;
    this.geometry = geometry;
    this.scheduler = scheduler;
    this.workers = List.copyOf(workers);
    this.tokensPerStep = tokensPerStep;
    this.allocator = new BlockAllocator(geometry.numBlocks());
    // Scattered block ids, as a cache that has been in use for a while hands out.
    allocator.shuffleFree(seed);
    this.cache = cache;
    this.layerCount = cache.layers();
    this.loop = new Thread(this::run, "sim-engine-" + engineId);
    loop.setDaemon(true);
  }

  public void start() {
    loop.start();
  }

  public Role role() {
    return role;
  }

  public String engineId() {
    return engineId;
  }

  /** Called from any thread (the actor): the loop picks it up at its next step. */
  public void submit(EngineService.Submit s) {
    String stopped = stoppedBecause;
    if (stopped != null) {
      s.replyTo().tell(new Outcome(s.spec().requestId(), engineId, role, Status.FAILED, null, 0, 0,
          stopped));
      return;
    }
    inbox.add(s);
  }

  public EngineService.Stats stats() {
    return new EngineService.Stats(
        engineId, role, allocator.numBlocks(), allocator.freeCount(), inFlight + inbox.size(),
        workers.stream().mapToLong(w -> w.sink().bytesMoved()).sum());
  }

  private void run() {
    while (running) {
      try {
        step();
      } catch (CudaException e) {
        // CUDA errors are sticky (every later call fails too): answer every request, then stop.
        log.error("simulated engine {}: the GPU failed; failing every request and stopping",
            engineId, e);
        stopAndFailEverything("simulated engine " + engineId + " stopped, its GPU failed: "
            + e.getMessage());
      } catch (RuntimeException e) {
        log.error("simulated engine {} step failed", engineId, e);
        // A failure that repeats every step must not flood the log.
        LockSupport.parkNanos(100_000_000L);
      }
    }
  }

  private void stopAndFailEverything(String reason) {
    stoppedBecause = reason;
    running = false;
    Set<SimRequest> pending = Collections.newSetFromMap(new IdentityHashMap<>());
    pending.addAll(waiting.values());
    pending.addAll(transferring.values());
    checking.forEach(c -> pending.add(c.request()));
    waiting.clear();
    transferring.clear();
    checking.clear();
    afterFence.clear();
    for (SimRequest r : pending) {
      allocator.free(r.blocks);
      reply(r, Status.FAILED, null, reason);
    }
    EngineService.Submit s;
    while ((s = inbox.poll()) != null) {
      s.replyTo().tell(new Outcome(s.spec().requestId(), engineId, role, Status.FAILED, null, 0, 0,
          reason));
    }
    inFlight = 0;
  }

  private void step() throws RuntimeException {
    boolean idle = waiting.isEmpty() && transferring.isEmpty() && checking.isEmpty()
        && afterFence.isEmpty();
    EngineService.Submit first;
    try {
      first = inbox.poll(idle ? 5_000 : 200, idle ? TimeUnit.MICROSECONDS : TimeUnit.MICROSECONDS);
    } catch (InterruptedException e) {
      running = false;
      return;
    }
    if (first != null) {
      admit(first);
      EngineService.Submit more;
      while ((more = inbox.poll()) != null) {
        admit(more);
      }
    }
    if (role == Role.PREFILL) {
      prefillStep();
    } else {
      decodeStep();
    }
    for (ConnectorWorker w : workers) {
      handleFinished(w.getFinished());
    }
    finishChecks();
    runPastFences();
    inFlight = waiting.size() + transferring.size() + checking.size();
  }

  /** Runs {@code action} on this thread once everything the cache has queued so far is done. */
  private void afterQueuedWork(SimKvCache.Fence fence, Runnable action) {
    if (afterFence.isEmpty() && fence.isComplete()) {
      action.run();
    } else {
      afterFence.add(new AfterFence(fence, action));
    }
  }

  private void runPastFences() {
    while (!afterFence.isEmpty() && afterFence.peek().fence().isComplete()) {
      afterFence.poll().action().run();
    }
  }

  private void admit(EngineService.Submit s) {
    SimRequest r = new SimRequest(s);
    RequestSpec.Abort abort = s.spec().abort();
    boolean abortNow =
        (role == Role.PREFILL && abort == RequestSpec.Abort.PREFILL_BEFORE_SCHEDULE)
            || (role == Role.DECODE && abort == RequestSpec.Abort.DECODE_BEFORE_SCHEDULE);
    if (abortNow) {
      r.request.setStatus(ConnectorRequest.Status.FINISHED_ABORTED);
      scheduler.requestFinished(r.request, new int[0]);
      reply(r, Status.ABORTED, null, "aborted before scheduling on " + engineId);
      return;
    }
    if (role == Role.DECODE && (s.params() == null || !s.params().doRemotePrefill())) {
      reply(r, Status.FAILED, null, "request " + r.id() + " has no kv_transfer_params from a prefill");
      return;
    }
    waiting.put(r.id(), r);
  }

  // ---- prefill ----

  private void prefillStep() {
    List<SchedulerOutput.NewRequest> fresh = new ArrayList<>();
    List<SchedulerOutput.CachedRequest> continued = new ArrayList<>();
    List<SimRequest> scheduled = new ArrayList<>();
    int budget = tokensPerStep;
    for (SimRequest r : waiting.values()) {
      if (budget <= 0) {
        break;
      }
      int prompt = r.request.numPromptTokens();
      int chunk = Math.min(prompt - r.computed, budget);
      int needBlocks = ceilDiv(r.computed + chunk, geometry.blockSize()) - r.blocks.length;
      int[] added = allocator.allocate(needBlocks);
      if (added == null) {
        break; // wait until transfers free blocks
      }
      boolean first = r.blocks.length == 0 && r.computed == 0;
      r.blocks = concat(r.blocks, added);
      int computedAfter = r.computed + chunk;
      if (first) {
        scheduler.updateStateAfterAlloc(r.request, r.blocks, 0);
        fresh.add(new SchedulerOutput.NewRequest(r.id(), r.blocks.clone(), computedAfter));
      } else {
        continued.add(new SchedulerOutput.CachedRequest(r.id(), added, computedAfter));
      }
      r.chunkFrom = r.computed;
      r.chunkTo = r.computed + chunk;
      budget -= chunk;
      scheduled.add(r);
    }
    ConnectorMetadata meta = scheduler.buildConnectorMeta(new SchedulerOutput(fresh, continued));
    workers.forEach(w -> w.startLoadKv(meta));
    SimKvCache.Fence computed = SimKvCache.Fence.DONE;
    if (!scheduled.isEmpty()) {
      List<TokenRange> ranges = new ArrayList<>();
      for (SimRequest r : scheduled) {
        ranges.add(new TokenRange(KvPattern.requestKey(r.id()), r.blocks, r.chunkFrom, r.chunkTo));
      }
      SimKvCache.ForwardPass pass = cache.forward(ranges);
      for (int layer = 0; layer < layerCount; layer++) {
        long firedNanos = 0;
        for (int rank = 0; rank < workers.size(); rank++) {
          // Computed (host) or queued with its event recorded behind it (GPU): never before.
          LayerEvent event = pass.layer(rank, layer);
          // Before the save: its message wakes an actor thread, which on a small host can take
          // this thread's core for a millisecond before the clock is read after it.
          firedNanos = System.nanoTime();
          workers.get(rank).saveKvLayer(meta, layer, event);
        }
        layerListener.layerFired(layer, layerCount, firedNanos);
      }
      computed = pass.end();
      workers.forEach(ConnectorWorker::waitForSave);
    }
    for (SimRequest r : scheduled) {
      r.computed = r.chunkTo;
      int prompt = r.request.numPromptTokens();
      if (r.computed < prompt && r.submit.spec().abort() == RequestSpec.Abort.PREFILL_MID) {
        waiting.remove(r.id());
        r.request.setStatus(ConnectorRequest.Status.FINISHED_ABORTED);
        scheduler.requestFinished(r.request, r.blocks);
        allocator.free(r.blocks);
        reply(r, Status.ABORTED, null, "aborted mid-prefill at token " + r.computed);
      } else if (r.computed >= prompt) {
        waiting.remove(r.id());
        r.request.setStatus(ConnectorRequest.Status.FINISHED_LENGTH_CAPPED);
        FinishDecision d = scheduler.requestFinished(r.request, r.blocks);
        if (d.delayFreeBlocks()) {
          transferring.put(r.id(), r);
        } else {
          allocator.free(r.blocks);
        }
        // READ: D reads P's blocks as soon as it has the params, so they go out only once the
        // step's KV is in place (at once on the host; when the GPU has run the step's kernels).
        // WRITE: D names its own blocks to P, so P's ids need not travel back through the
        // router (a long prompt's list can be larger than one cluster message).
        KvTransferParams forPeer =
            scheduler.mode() == TransferMode.READ ? d.paramsForPeer() : null;
        afterQueuedWork(computed, () -> reply(r, Status.DONE, forPeer, "prefilled"));
      }
    }
  }

  // ---- decode ----

  private void decodeStep() {
    Iterator<SimRequest> it = waiting.values().iterator();
    while (it.hasNext()) {
      SimRequest r = it.next();
      int prompt = r.request.numPromptTokens();
      int cached = Math.max(0, Math.min(r.submit.spec().decodeCachedTokens(), prompt - 1));
      cached -= cached % geometry.blockSize();
      MatchedTokens matched = scheduler.numNewMatchedTokens(r.request, cached);
      int[] blocks = allocator.allocate(ceilDiv(prompt, geometry.blockSize()));
      if (blocks == null) {
        break;
      }
      it.remove();
      r.blocks = blocks;
      r.cachedBlocks = cached / geometry.blockSize();
      // The prefix D already had: computed locally, so it is filled here, not transferred.
      cache.fill(new TokenRange(KvPattern.requestKey(r.id()), blocks, 0, cached));
      r.transferStartNanos = System.nanoTime();
      transferring.put(r.id(), r);
      scheduler.updateStateAfterAlloc(
          r.request, Arrays.copyOfRange(blocks, r.cachedBlocks, blocks.length), matched.count());
    }
    ConnectorMetadata meta =
        scheduler.buildConnectorMeta(new SchedulerOutput(List.of(), List.of()));
    workers.forEach(w -> w.startLoadKv(meta));
  }

  /**
   * Counts one rank's report of a request's end; once every rank reported it, their combined
   * report (with the first failure, if any), else null. With one rank every report is final.
   */
  private @Nullable RankReports lastReport(String requestId, @Nullable String failureOrNull) {
    RankReports r = reports.computeIfAbsent(requestId, k -> new RankReports());
    r.count++;
    if (r.failure == null) {
      r.failure = failureOrNull;
    }
    if (r.count < workers.size()) {
      return null;
    }
    reports.remove(requestId);
    return r;
  }

  private void handleFinished(Finished f) {
    if (f.isEmpty()) {
      return;
    }
    for (String id : f.doneSending()) {
      RankReports all = lastReport(id, null);
      if (all == null) {
        continue;
      }
      SimRequest r = transferring.remove(id);
      if (r != null) {
        allocator.free(r.blocks);
      }
    }
    for (Map.Entry<String, String> e : f.failed().entrySet()) {
      RankReports all = lastReport(e.getKey(), e.getValue());
      if (all != null) {
        failed(e.getKey(), all.failure != null ? all.failure : e.getValue());
      }
    }
    for (String id : f.doneReceiving()) {
      RankReports all = lastReport(id, null);
      if (all == null) {
        continue;
      }
      if (all.failure != null) {
        failed(id, all.failure); // another rank's part failed
        continue;
      }
      SimRequest r = transferring.remove(id);
      if (r == null) {
        continue;
      }
      long nanos = System.nanoTime() - r.transferStartNanos;
      SimKvCache.Check check = cache.check(
          new TokenRange(KvPattern.requestKey(id), r.blocks, 0, r.request.numPromptTokens()));
      checking.add(new PendingCheck(r, check, nanos));
    }
  }

  /** D: replies for the checks that are done, and frees their blocks. */
  private void finishChecks() {
    Iterator<PendingCheck> it = checking.iterator();
    while (it.hasNext()) {
      PendingCheck c = it.next();
      if (!c.check().isDone()) {
        continue;
      }
      it.remove();
      SimRequest r = c.request();
      KvPattern.Mismatch bad = c.check().firstMismatch();
      allocator.free(r.blocks);
      if (bad == null) {
        replyDone(r, transferredBytes(r), c.transferNanos());
      } else {
        reply(r, Status.MISMATCH, null, "request " + r.id() + ": " + bad);
      }
    }
  }

  private void failed(String requestId, String reason) {
    SimRequest r = transferring.remove(requestId);
    if (r != null) {
      // Not before this engine's own queued kernels (D's prefix fill) are off the blocks.
      afterQueuedWork(cache.fence(), () -> allocator.free(r.blocks));
      if (role == Role.DECODE) {
        reply(r, Status.FAILED, null, reason);
      }
    }
  }

  private long transferredBytes(SimRequest r) {
    int blocks = r.blocks.length - r.cachedBlocks;
    return (long) blocks * geometry.blockBytes() * geometry.regionsPerLayer() * layerCount
        * workers.size();
  }

  private void replyDone(SimRequest r, long bytes, long nanos) {
    r.submit.replyTo().tell(
        new Outcome(r.id(), engineId, role, Status.DONE, null, bytes, nanos, "verified"));
  }

  private void reply(SimRequest r, Status status, dev.kvferry.actors.connector.@Nullable KvTransferParams p,
      String detail) {
    r.submit.replyTo().tell(new Outcome(r.id(), engineId, role, status, p, 0, 0, detail));
  }

  private static int ceilDiv(int a, int b) {
    return (a + b - 1) / b;
  }

  private static int[] concat(int[] a, int[] b) {
    int[] out = Arrays.copyOf(a, a.length + b.length);
    System.arraycopy(b, 0, out, a.length, b.length);
    return out;
  }

  /** Stops the loop and waits for it, so the cache can be freed after. */
  @Override
  public void close() {
    running = false;
    loop.interrupt();
    if (loop.isAlive() && Thread.currentThread() != loop) {
      try {
        loop.join(5_000);
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
      }
    }
  }
}
