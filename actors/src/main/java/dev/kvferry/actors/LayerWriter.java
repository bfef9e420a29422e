package dev.kvferry.actors;

import dev.kvferry.actors.engine.AgentMetadata;
import dev.kvferry.rdma.EventOrderedTransport;
import dev.kvferry.rdma.MemoryRegion;
import dev.kvferry.rdma.PeerDoneWords;
import dev.kvferry.rdma.RegionDescriptor;
import dev.kvferry.rdma.TransferBatch;
import dev.kvferry.rdma.TransferStatus;
import dev.kvferry.rdma.Transport;
import dev.kvferry.rdma.cuda.CudaEvent;
import dev.kvferry.rdma.cuda.SharedDoneWords;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.Executor;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.function.Function;
import java.util.function.ObjIntConsumer;
import org.jspecify.annotations.Nullable;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The transport side of P's writes, for its {@link WriterActor}: hands one layer's copies to one
 * D worker on the I/O executor (behind the layer's CUDA event on the copy stream where the
 * transport orders copies on the GPU), stores D's done word behind a target's last copies
 * through the transport ({@link PeerDoneWords}: cuda, cma, tcp), and
 * releases what the transport keeps for a peer that left. Used from the writer's thread only; the
 * copies themselves run on the I/O executor.
 */
final class LayerWriter {
  private static final Logger log = LoggerFactory.getLogger(LayerWriter.class);

  private final List<MemoryRegion> layerRegions;
  private final Transport transport;
  /** The transport's GPU ordering (copies behind CUDA events, done words), resolved once. */
  private final @Nullable EventOrderedTransport eventOrdered;
  /** Whether the transport stores D's done words behind its writes, resolved once. */
  private final boolean storesDoneWords;
  private final Executor io;
  /**
   * Submissions queued behind CUDA events, one at a time in issue order: the copy stream runs
   * what it is given in order, so a layer queued ahead of an earlier one would hold that one (and
   * everything after it) until its own, later, event; on the pool's threads in parallel they
   * landed on the stream in any order.
   */
  private final Executor gpuOrdered;
  /** D's done-word files as the transport reaches them (mapped, where it maps), by file name. */
  private final Map<String, PeerDoneWords> doneWords = new HashMap<>();
  /** Which decode engine each mapped done-word file belongs to, to unmap it when it leaves. */
  private final Map<String, String> doneWordsOwner = new HashMap<>();
  private final Set<String> unusableDoneWords = new HashSet<>();
  /** Writes submitted and not ended yet: a stopping writer waits for them ({@link #close}). */
  private final Set<CompletableFuture<TransferStatus>> unended = ConcurrentHashMap.newKeySet();

  /**
   * D's watcher spins once a hint says this many layers or fewer are still to land: the
   * second-to-last layer's copy has landed and the last one's is queued behind its compute.
   */
  static final int NEAR_LAYERS = 2;

  /**
   * Where a layer's copies wait for the engine's CUDA event: {@code gpu} (the default) queues
   * them behind it on the copy stream; {@code cpu} submits them once the event poller has seen
   * the event fire, so the node's stream never holds a wait on another process's event while that
   * process computes (docs/gpu.md measures both).
   */
  static final String SAVE_WAIT_PROPERTY = "kvferry.cuda.save-wait";

  private final boolean waitsOnGpu;

  /**
   * When a step's layers go: {@code each} (the default) queues a layer's copies as soon as the
   * engine saved it, overlapping them with the later layers' compute; {@code together} holds them
   * until the step's last layer and queues all of them behind its event, so the node's context
   * takes the GPU from the engine's once per step instead of once per layer (P and the node share
   * a GPU; docs/gpu.md measures both). Only with copies ordered on the GPU.
   */
  static final String SAVE_LAYERS_PROPERTY = "kvferry.cuda.save-layers";

  private final boolean savesTogether;

  LayerWriter(List<MemoryRegion> layerRegions, Transport transport, Executor io) {
    this.layerRegions = List.copyOf(layerRegions);
    this.transport = transport;
    this.eventOrdered = transport instanceof EventOrderedTransport e ? e : null;
    this.storesDoneWords = transport.storesDoneWords();
    this.io = io;
    this.gpuOrdered = new SerialExecutor(io);
    boolean cpuWait = picksSecond(SAVE_WAIT_PROPERTY, "gpu", "cpu");
    this.waitsOnGpu = eventOrdered != null && !cpuWait;
    boolean together = picksSecond(SAVE_LAYERS_PROPERTY, "each", "together");
    this.savesTogether = waitsOnGpu && together;
  }

  /**
   * Whether system property {@code property} is {@code second}; unset or {@code first} is false,
   * anything else is refused with both choices.
   */
  private static boolean picksSecond(String property, String first, String second) {
    String value = System.getProperty(property, first);
    if (value.equals(first) || value.equals(second)) {
      return value.equals(second);
    }
    throw new IllegalArgumentException(
        property + " must be " + first + " or " + second + ", got '" + value + "'");
  }

  int layers() {
    return layerRegions.size();
  }

  /** Whether copies wait for a layer's CUDA event on the GPU (else the writer waits for it). */
  boolean ordersOnGpu() {
    return waitsOnGpu;
  }

  /** Whether a step's layers are held until its last one and queued behind that one's event. */
  boolean savesTogether() {
    return savesTogether;
  }

  /** Whether D's done words can be stored behind our writes (D offers one only then). */
  boolean storesDoneWords() {
    return storesDoneWords;
  }

  /**
   * Writes layer {@code layer} of job {@code j} to target {@code t}: its copies are submitted on
   * the I/O executor (skipped, failed, if the job is cancelled by then). Completes when they are
   * done.
   */
  CompletableFuture<TransferStatus> write(
      WriteJob j, WriteJob.Target t, AgentMetadata peer, TransferBatch plan, int layer) {
    CudaEvent after = j.gpuEvents.get(layer);
    CompletableFuture<TransferStatus> submission = submit(layer, peer, plan, after, j.cancelled);
    if (t.doneWord != null) {
      t.submitted.add(submission); // the done word is stored behind every layer's copies
      if (after != null && eventOrdered != null && !t.doneWordQueued
          && layerRegions.size() - layer == NEAR_LAYERS) {
        hintAfterQueued(j, t.doneWord, peer, submission);
      }
    }
    CompletableFuture<TransferStatus> ended = submission.thenCompose(TransferStatus::completion);
    unended.add(ended);
    ended.whenComplete((status, e) -> unended.remove(ended));
    return ended;
  }

  /**
   * GPU-ordered writes: behind the second-to-last layer's copies, on the strand that queued them,
   * a hint in D's done word that {@link #NEAR_LAYERS} layers are still to land, so D's watcher,
   * which polls GPU-stored words in parks of some 20 us, spins through the last layer's copy
   * instead. Only that layer hints (D acts on no other), and the last gets none: its word is the
   * done value, stored once the job is sealed; a hint there would only delay it. A hint is never a
   * completion; one that fails is dropped.
   */
  private void hintAfterQueued(
      WriteJob j, PeerProtocol.DoneWord word, AgentMetadata peer,
      CompletableFuture<TransferStatus> submission) {
    PeerDoneWords words;
    if (peer.layers().isEmpty() || (words = doneWordsOf(word, j.decodeEngineId)) == null) {
      return;
    }
    MemoryRegion local = layerRegions.get(0);
    RegionDescriptor remote = peer.layers().get(0);
    long value = SharedDoneWords.progressValue(word.value(), NEAR_LAYERS);
    try {
      gpuOrdered.execute(() -> {
        // The strand ran the layer's submission first: hint only behind copies that were queued.
        TransferStatus queued =
            submission.isDone() && !submission.isCompletedExceptionally() ? submission.join() : null;
        if (j.cancelled.get() || queued == null || queued.state() == TransferStatus.State.FAILED) {
          return;
        }
        try {
          words.hintAfterQueued(local, remote, word.slot(), value);
        } catch (RuntimeException e) {
          log.debug("no hint into done words {} ({}); D polls them as before", word.file(),
              e.toString());
        }
      });
    } catch (java.util.concurrent.RejectedExecutionException e) {
      // the I/O pool is shutting down: no more copies, so no hint is wanted
    }
  }

  /**
   * Writes to {@code t} every fired layer of {@code j} not issued to it yet, in firing order, each
   * handed to {@code issued} with its completion; then stores D's done word if it is due.
   */
  void writeFired(
      WriteJob j, WriteJob.Target t, AgentMetadata peer, TransferBatch plan,
      ObjIntConsumer<CompletableFuture<TransferStatus>> issued) {
    while (t.issued < j.firedLayers.size()) {
      int layer = j.firedLayers.getInt(t.issued++);
      j.inFlight++;
      issued.accept(write(j, t, peer, plan, layer), layer);
    }
    storeDoneWordIfDue(j, t);
  }

  /** After the seal: each target's done word is stored once all its layers are queued. */
  void storeDoneWordsIfDue(WriteJob j) {
    int[] ranks = j.targetRanks;
    if (ranks == null) {
      return;
    }
    for (int rank : ranks) {
      WriteJob.Target t = j.targets.get(rank);
      if (t != null) {
        storeDoneWordIfDue(j, t);
      }
    }
  }

  /** Once every layer of a target is queued: D's done word is stored behind them all. */
  void storeDoneWordIfDue(WriteJob j, WriteJob.Target t) {
    PeerProtocol.DoneWord word = t.doneWord;
    AgentMetadata peer = t.peer;
    if (word == null || peer == null || t.doneWordQueued || j.expected < 0
        || t.issued < j.expected) {
      return;
    }
    t.doneWordQueued = true;
    storeDoneWord(j.transferId, j.decodeEngineId, peer, word, t.submitted);
  }

  /** The future completes once the copies are queued, not done. */
  private CompletableFuture<TransferStatus> submit(
      int layer, AgentMetadata peer, TransferBatch plan, @Nullable CudaEvent after,
      AtomicBoolean cancelled) {
    MemoryRegion local = layerRegions.get(layer);
    RegionDescriptor remote = peer.layers().get(layer);
    WriteStamps.mark(WriteStamps.Stage.ISSUED);
    if (after == null && transport.startsWithoutBlocking(plan)) {
      // The transport hands the copy to its own threads at once: a hop through the I/O pool
      // first would only add a thread wake-up (about 60-100 us) before the copy starts.
      try {
        return CompletableFuture.completedFuture(start(local, remote, plan, null, cancelled));
      } catch (RuntimeException e) {
        return CompletableFuture.failedFuture(e); // as the I/O pool's future would carry it
      }
    }
    // Copies the GPU orders go through one serial queue, so they reach the copy stream in issue
    // order; so do those of a writer that waited for the events itself (save-wait cpu).
    boolean serial = eventOrdered != null && (after != null || !waitsOnGpu);
    return CompletableFuture.supplyAsync(() -> start(local, remote, plan, after, cancelled),
        serial ? gpuOrdered : io);
  }

  /** Hands one layer's copies to the transport, behind {@code after} where the GPU orders them. */
  private TransferStatus start(MemoryRegion local, RegionDescriptor remote, TransferBatch plan,
      @Nullable CudaEvent after, AtomicBoolean cancelled) {
    WriteStamps.mark(WriteStamps.Stage.IO_STARTED);
    if (cancelled.get()) {
      return TransferStatus.failed("transfer abandoned before this layer was written");
    }
    EventOrderedTransport ordered = eventOrdered;
    TransferStatus status = after != null && ordered != null
        ? ordered.writeAfter(after, local, remote, plan)
        : transport.write(local, remote, plan);
    WriteStamps.mark(WriteStamps.Stage.SUBMIT_RETURNED);
    return status;
  }

  /**
   * Stores D's done word through the transport behind every layer's writes, once every
   * submission returned (they run on the io pool in any order). The transport decides what
   * "behind" takes: cuda queues the store on the copy stream behind the copies; cma and tcp wait
   * for the writes to land (a failed one: no word). D then learns as soon as the last byte landed;
   * WriteDone still follows.
   */
  private void storeDoneWord(
      String transferId, String decodeEngineId, AgentMetadata peer, PeerProtocol.DoneWord word,
      List<CompletableFuture<TransferStatus>> submitted) {
    if (!storesDoneWords || peer.layers().isEmpty() || layerRegions.isEmpty()) {
      return;
    }
    PeerDoneWords words = doneWordsOf(word, decodeEngineId);
    if (words == null) {
      return;
    }
    MemoryRegion local = layerRegions.get(0);
    RegionDescriptor remote = peer.layers().get(0);
    WriteStamps.mark(WriteStamps.Stage.DONE_WORD_QUEUED);
    CompletableFuture<Void> allSubmitted =
        CompletableFuture.allOf(submitted.toArray(CompletableFuture[]::new));
    Function<Object, CompletableFuture<TransferStatus>> store = ignored -> {
      WriteStamps.mark(WriteStamps.Stage.DONE_WORD_TASK);
      List<TransferStatus> writes = new ArrayList<>(submitted.size());
      for (CompletableFuture<TransferStatus> s : submitted) {
        writes.add(s.join());
      }
      return words.storeAfter(writes, local, remote, word.slot(), word.value()).completion();
    };
    // cuda queues the store on its copy stream, a driver call: kept off the writer's thread, on
    // the I/O pool. Not on the strand of the submissions: there it waited behind every other
    // request's queued submissions; the transport orders it after our copies under the lane's
    // lock, and against a peer's cleanup under the words' lock. The host transports only hang
    // the store on the writes' completions, so no hop: through the I/O pool it ran after the
    // last copy had ended in 10% or more of the e2e bench's requests.
    (eventOrdered != null ? allSubmitted.thenComposeAsync(store, io)
        : allSubmitted.thenCompose(store))
        .whenComplete((stored, error) -> {
          String why = error != null ? error.toString()
              : stored.succeeded() ? null : stored.failureMessage();
          if (why == null) {
            WriteStamps.mark(WriteStamps.Stage.DONE_WORD_STORED);
          }
          if (why != null) {
            log.debug("done word of transfer {} not stored ({}); D learns from WriteDone",
                transferId, why);
          }
        });
  }

  /** D's done words, opened through the transport once per file; null if they cannot be. */
  private @Nullable PeerDoneWords doneWordsOf(PeerProtocol.DoneWord w, String decodeEngineId) {
    if (unusableDoneWords.contains(w.file())) {
      return null;
    }
    PeerDoneWords words = doneWords.get(w.file());
    if (words == null) {
      try {
        words = transport.openPeerDoneWords(w.file(), w.slots());
        doneWords.put(w.file(), words);
        doneWordsOwner.put(w.file(), decodeEngineId);
      } catch (RuntimeException e) {
        unusableDoneWords.add(w.file());
        log.info("done words {} unusable here ({}); D learns from WriteDone", w.file(),
            e.getMessage());
        return null;
      }
    }
    return words;
  }

  /**
   * A peer worker incarnation left: its transport state is released and, when its whole engine
   * is gone ({@code engineGone}) and we mapped its done words, those are unmapped after its copy
   * streams have drained (a store into them may still be queued).
   */
  void peerGone(AgentMetadata metadata, boolean engineGone) {
    if (metadata.layers().isEmpty()) {
      return;
    }
    RegionDescriptor any = metadata.layers().get(0);
    String engine = metadata.engineId();
    List<PeerDoneWords> unmap = new ArrayList<>();
    if (engineGone) {
      doneWordsOwner.entrySet().removeIf(e -> {
        if (e.getValue().equals(engine)) {
          PeerDoneWords w = doneWords.remove(e.getKey());
          if (w != null) {
            unmap.add(w);
          }
          return true;
        }
        return false;
      });
    }
    // Blocking native calls (a copy stream waits for its queued copies): off the actor thread,
    // and in this order: streams drained, then the words their stores target unmapped. On the
    // strand that queues GPU-ordered copies and hints, so neither is queued between the drain
    // and the unmapping (a GPU store into memory no longer registered); a done word's store
    // checks under the words' lock that they are not closed, and close drains after that.
    gpuOrdered.execute(() -> {
      try {
        transport.peerGone(any);
      } catch (RuntimeException e) {
        log.warn("releasing transport state of {}: {}", engine, e.toString());
      }
      unmap.forEach(PeerDoneWords::close);
    });
  }

  /**
   * The writer stopped: waits up to {@code bound} for the writes already under way (cancelled
   * ones skip their copies and end at once), then unmaps every done-word file. Called before the
   * worker's actor terminates, which is how D learns it stopped: a copy still running would
   * otherwise land in blocks D may free once it sees this worker gone.
   */
  void close(Duration bound) {
    CompletableFuture<?>[] pending = unended.toArray(CompletableFuture[]::new);
    try {
      CompletableFuture.allOf(pending).get(bound.toNanos(), TimeUnit.NANOSECONDS);
    } catch (TimeoutException e) {
      log.warn("{} of our writes still under way {} after the writer stopped; D may see it gone"
          + " before they land", unended.size(), bound);
    } catch (ExecutionException e) {
      // a write that failed is over: nothing of it can land any more
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
    }
    doneWords.values().forEach(PeerDoneWords::close);
  }
}
