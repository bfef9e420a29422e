package dev.kvferry.bench.gpu;

import com.typesafe.config.Config;
import com.typesafe.config.ConfigFactory;
import dev.kvferry.actors.connector.ConnectorMetadata;
import dev.kvferry.actors.connector.ConnectorRequest;
import dev.kvferry.actors.connector.ConnectorScheduler;
import dev.kvferry.actors.connector.ConnectorWorker;
import dev.kvferry.actors.connector.CudaLayerEvent;
import dev.kvferry.actors.connector.Finished;
import dev.kvferry.actors.connector.KvTransferParams;
import dev.kvferry.actors.connector.Role;
import dev.kvferry.actors.connector.SchedulerOutput;
import dev.kvferry.actors.connector.TransferMode;
import dev.kvferry.actors.engine.ConnectorSettings;
import dev.kvferry.actors.engine.EngineIdentity;
import dev.kvferry.actors.plan.KvCacheGeometry;
import dev.kvferry.rdma.CudaTransport;
import dev.kvferry.rdma.RegionDescriptor;
import dev.kvferry.rdma.RegionRegistry;
import dev.kvferry.rdma.TransferBatch;
import dev.kvferry.rdma.TransferStatus;
import dev.kvferry.rdma.cuda.Cuda;
import dev.kvferry.rdma.cuda.CudaEvent;
import dev.kvferry.rdma.cuda.CudaEventPoller;
import dev.kvferry.sim.SimKernels;
import dev.kvferry.rdma.cuda.CudaStream;
import dev.kvferry.actors.EngineActor;
import dev.kvferry.actors.WriteStamps;
import dev.kvferry.bench.Samples;
import dev.kvferry.bench.StageMedians;
import java.time.Clock;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collections;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.pekko.actor.typed.ActorSystem;
import org.apache.pekko.actor.typed.javadsl.AskPattern;
import org.apache.pekko.actor.typed.javadsl.Behaviors;
import org.apache.pekko.actor.typed.receptionist.Receptionist;
import org.apache.pekko.cluster.MemberStatus;
import org.apache.pekko.cluster.typed.Cluster;
import org.apache.pekko.cluster.typed.Join;

/**
 * The real connector path on GPUs: P's {@link ConnectorWorker} and D's, each in its own actor
 * system, the two joined as a Pekko cluster over Artery on loopback (messages CBOR on the wire),
 * P's KV cache on GPU {@code --p-gpu} and D's on {@code --d-gpu}, both moved by {@link
 * CudaTransport}. Per request, P "computes" each layer on its compute stream (the pattern fill
 * plus a spin), records a CUDA event and calls {@code saveKvLayer(meta, layer, CudaLayerEvent)}
 * at once, as an engine's forward pass does; the WriterActor queues that layer's copies behind
 * the event ({@code writeAfter}). D's done is when its worker's {@code getFinished()} first lists
 * the request; then every word of the request's blocks is checked on D's GPU by a kernel.
 *
 * <p>Usage: {@code GpuConnectorRun --p-gpu 0 --d-gpu 1 [--layers 32] [--blocks 2048] [--capacity
 * 4096] [--requests 9] [--warmup 100] [--spin-us 300] [--fill-ctas SMs]}. One JVM, so the IPC
 * path is not taken: CUDA IPC is exercised by {@link GpuTransferBench}'s two processes. Loopback
 * cluster config lives here, not in a config file, because this is a self-contained run, not a
 * node. Each timed request prints where its last layer's write spent its time ({@link
 * WriteStamps}); the summary adds one layer's write of the same blocks timed in the same run, the
 * goal's budget, and the tail's p50 and p99 against it.
 */
public final class GpuConnectorRun {

  private static final int BLOCK_TOKENS = 16;
  private static final int KV_HEADS = 8;
  private static final int HEAD_DIM = 128;
  private static final int ELEMENT_BYTES = 2; // 16 x 8 x 128 x 2 = 32 KiB per block, per K or V

  private GpuConnectorRun() {}

  public static void main(String[] args) throws Exception {
    Map<String, String> o = new LinkedHashMap<>();
    for (int i = 0; i + 1 < args.length; i += 2) {
      o.put(args[i].replaceFirst("^--", ""), args[i + 1]);
    }
    int pGpu = Integer.parseInt(o.getOrDefault("p-gpu", "0"));
    int dGpu = Integer.parseInt(o.getOrDefault("d-gpu", "0"));
    int layers = Integer.parseInt(o.getOrDefault("layers", "32"));
    int blocks = Integer.parseInt(o.getOrDefault("blocks", "2048"));
    int capacity = Integer.parseInt(o.getOrDefault("capacity", "4096"));
    int requests = Integer.parseInt(o.getOrDefault("requests", "9"));
    // Untimed requests first, so the timed ones run the nodes' per-request code compiled, as a
    // serving node does (20 cold requests ran it interpreted: 1.3 ms to issue 32 layers).
    int warmup = Integer.parseInt(o.getOrDefault("warmup", "100"));
    long spinNs = Long.parseLong(o.getOrDefault("spin-us", "300")) * 1000;
    // CTAs of the stand-in compute kernel (default: one per SM, i.e. every SM busy all layer).
    int fillCtas = Integer.parseInt(o.getOrDefault("fill-ctas", "0"));
    if (!Cuda.available()) {
      System.err.println("CUDA not available: " + Cuda.unavailableReason());
      System.exit(2);
    }
    System.exit(run(pGpu, dGpu, layers, blocks, capacity, requests, warmup, spinNs, fillCtas) ? 0 : 1);
  }

  private static Config clusterConfig(String role) {
    return ConfigFactory.parseString(
            """
            pekko.loglevel = WARNING
            pekko.actor.provider = cluster
            pekko.remote.artery.canonical { hostname = "127.0.0.1", port = 0 }
            pekko.cluster.seed-nodes = []
            pekko.cluster.roles = [%s]
            pekko.cluster.jmx.multi-mbeans-in-same-jvm = on
            pekko.coordinated-shutdown.exit-jvm = off
            pekko.coordinated-shutdown.run-by-jvm-shutdown-hook = off
            """.formatted(role))
        .withFallback(ConfigFactory.load());
  }

  private static boolean run(int pGpu, int dGpu, int layers, int blocks, int capacity,
      int requests, int warmup, long spinNs, int fillCtas) throws Exception {
    KvCacheGeometry geometry =
        KvCacheGeometry.standard(capacity, BLOCK_TOKENS, KV_HEADS, HEAD_DIM, ELEMENT_BYTES);
    long blockBytes = geometry.blockBytes();
    WriteStamps.enable(); // a nanoTime per stage: the tail's breakdown (issue 19)
    ActorSystem<Void> pSystem =
        ActorSystem.create(Behaviors.empty(), "kvferry", clusterConfig(Role.PREFILL.clusterRole()));
    ActorSystem<Void> dSystem =
        ActorSystem.create(Behaviors.empty(), "kvferry", clusterConfig(Role.DECODE.clusterRole()));
    RegionRegistry pRegistry = new RegionRegistry("prefill-0");
    RegionRegistry dRegistry = new RegionRegistry("decode-0");
    GpuKvLayers pKv = new GpuKvLayers(pRegistry, pGpu, layers, capacity, blockBytes);
    GpuKvLayers dKv = new GpuKvLayers(dRegistry, dGpu, layers, capacity, blockBytes);
    CudaTransport pTransport = new CudaTransport();
    CudaTransport dTransport = new CudaTransport();
    boolean ok = true;
    try {
      Cluster p = Cluster.get(pSystem);
      Cluster d = Cluster.get(dSystem);
      p.manager().tell(Join.create(p.selfMember().address()));
      d.manager().tell(Join.create(p.selfMember().address()));
      long deadline = System.nanoTime() + 60_000_000_000L;
      while (p.selfMember().status() != MemberStatus.up()
          || d.selfMember().status() != MemberStatus.up()) {
        if (System.nanoTime() > deadline) {
          throw new IllegalStateException("the two actor systems did not form a cluster in 60 s");
        }
        Thread.sleep(50);
      }
      System.out.printf(Locale.ROOT,
          "cluster up: P %s, D %s; P on GPU %d (%s), D on GPU %d; %d layers x %d blocks x 2 x %d B%n",
          p.selfMember().address(), d.selfMember().address(), pGpu, Cuda.deviceName(pGpu), dGpu,
          layers, blocks, blockBytes);
      ConnectorSettings s = ConnectorSettings.DEFAULTS;
      ConnectorWorker pWorker = new ConnectorWorker(pSystem,
          new EngineIdentity(Role.PREFILL, "prefill-0", 0, 1, 0, 1, TransferMode.WRITE), pTransport, s);
      ConnectorWorker dWorker = new ConnectorWorker(dSystem,
          new EngineIdentity(Role.DECODE, "decode-0", 0, 1, 0, 1, TransferMode.WRITE), dTransport, s);
      pWorker.registerKvCaches(geometry, pKv.regions);
      dWorker.registerKvCaches(geometry, dKv.regions);
      awaitListed(pSystem, Role.DECODE);
      awaitListed(dSystem, Role.PREFILL);
      ConnectorScheduler pSched = new ConnectorScheduler(Role.PREFILL, TransferMode.WRITE,
          "prefill-0", 0, BLOCK_TOKENS, List.of(pWorker.engineRef()), s, Clock.systemUTC());
      ConnectorScheduler dSched = new ConnectorScheduler(Role.DECODE, TransferMode.WRITE,
          "decode-0", 0, BLOCK_TOKENS, List.of(dWorker.engineRef()), s, Clock.systemUTC());

      // Both sides scattered, as caches in use hand them out: each a random subset of its cache
      // (at least twice the request), so the copy is one entry per block.
      if (2L * blocks > capacity) {
        throw new IllegalArgumentException("--capacity " + capacity + " must be at least twice"
            + " --blocks " + blocks);
      }
      int[] pIds = new int[blocks];
      int[] dIds = new int[blocks];
      List<Integer> pFree = new ArrayList<>();
      List<Integer> dFree = new ArrayList<>();
      for (int i = 0; i < capacity; i++) {
        pFree.add(i);
        dFree.add(i);
      }
      Collections.shuffle(pFree, new java.util.Random(6));
      Collections.shuffle(dFree, new java.util.Random(7));
      for (int i = 0; i < blocks; i++) {
        pIds[i] = pFree.get(i);
        dIds[i] = dFree.get(i);
      }
      long[] pSlots = pKv.slotOffsets(pIds);
      long pOffsets = pKv.upload(pSlots);
      SimKernels k = SimKernels.forDevice(pGpu);
      List<CudaEvent> events = new ArrayList<>();
      for (int l = 0; l < layers; l++) {
        events.add(CudaEvent.create(pGpu, true));
      }
      List<Double> tails = new ArrayList<>();
      List<Double> totals = new ArrayList<>();
      List<double[]> stages = new ArrayList<>();
      int prompt = blocks * BLOCK_TOKENS;
      long watcherCpu0 = 0;
      long timed0 = 0;
      try (CudaStream compute = CudaStream.create(pGpu)) {
        for (int r = -warmup; r < requests; r++) {
          if (r == 0) {
            watcherCpu0 = watcherCpuNanos();
            timed0 = System.nanoTime();
          }
          String id = "req-" + r;
          int seed = 5000 + r;
          dKv.clear();
          ConnectorRequest dReq =
              new ConnectorRequest(id, prompt, KvTransferParams.forDecode("tx-" + r, "prefill-0", 0));
          ConnectorRequest pReq =
              new ConnectorRequest(id, prompt, KvTransferParams.forPrefill("tx-" + r, "decode-0", 0));
          WriteStamps.reset();
          long announced = System.nanoTime();
          dSched.numNewMatchedTokens(dReq, 0);
          dSched.updateStateAfterAlloc(dReq, dIds, prompt);
          pSched.updateStateAfterAlloc(pReq, pIds, 0);
          ConnectorMetadata meta = pSched.buildConnectorMeta(new SchedulerOutput(
              List.of(new SchedulerOutput.NewRequest(id, pIds)), List.of()));
          AtomicLong lastLayerSeen = new AtomicLong();
          long t0 = System.nanoTime();
          for (int l = 0; l < layers; l++) {
            k.fillPattern(compute, pKv.regions.get(l).address(), pOffsets, pSlots.length,
                blockBytes, l, seed, spinNs, fillCtas > 0 ? fillCtas : k.multiProcessors());
            events.get(l).record(compute);
            pWorker.saveKvLayer(meta, l, new CudaLayerEvent(events.get(l)));
          }
          long lastSaveReturned = System.nanoTime();
          pWorker.waitForSave();
          long waitedForSave = System.nanoTime();
          CudaEventPoller.common().watch(events.get(layers - 1),
              () -> lastLayerSeen.set(System.nanoTime()), e -> { });
          pReq.setStatus(ConnectorRequest.Status.FINISHED_LENGTH_CAPPED);
          pSched.requestFinished(pReq, pIds);
          long dDone = awaitReceived(dWorker, id, 60_000_000_000L);
          while (lastLayerSeen.get() == 0) {
            Thread.onSpinWait();
          }
          double tailUs = (dDone - lastLayerSeen.get()) / 1e3;
          double totalMs = (dDone - t0) / 1e6;
          long bad = GpuTransferBench.verify(dKv, dIds, seed);
          awaitSent(pWorker, id, 60_000_000_000L);
          if (bad != 0) {
            ok = false;
            System.out.println("VERIFY FAILED: " + bad + " words differ at D for " + id);
          }
          if (r < 0) {
            continue; // warm-up: not timed
          }
          tails.add(tailUs);
          totals.add(totalMs);
          double[] st = stages(lastLayerSeen.get(), announced, lastSaveReturned, waitedForSave, dDone);
          stages.add(st);
          System.out.printf(Locale.ROOT,
              "request %s: last layer's event -> D's getFinished %.1f us; "
                  + "first layer -> D done %.2f ms; mismatched words %d; stages (us after the"
                  + " poller saw the last event) %s%n",
              id, tailUs, totalMs, bad,
              StageMedians.describe(STAGE_NAMES, new double[][] {st}));
        }
      } finally {
        for (CudaEvent e : events) {
          e.close();
        }
        Cuda.free(pOffsets);
      }
      double watcherCpuMs = (watcherCpuNanos() - watcherCpu0) / 1e6;
      double timedMs = (System.nanoTime() - timed0) / 1e6;
      Collections.sort(tails);
      Collections.sort(totals);
      System.out.printf(Locale.ROOT,
          "ACTORS P GPU %d -> D GPU %d: %d requests of %.2f GiB through"
              + " ConnectorWorker/WriterActor/CudaTransport; last layer's event -> D done p50 %.1f us"
              + " (min %.1f, max %.1f); request p50 %.2f ms; %s%n",
          pGpu, dGpu, requests, 2.0 * layers * blocks * blockBytes / (1L << 30),
          Samples.median(tails), tails.get(0), tails.get(tails.size() - 1),
          totals.get(totals.size() / 2), ok ? "every byte verified" : "VERIFY FAILED");
      double layerUs = oneLayersWrite(pTransport, dTransport, pKv, dKv, pIds, dIds);
      double[] tailUs = tails.stream().mapToDouble(Double::doubleValue).toArray();
      double tailP50 = Samples.median(tailUs);
      double tailP99 = Samples.percentile(tailUs, 99);
      System.out.printf(Locale.ROOT,
          "ACTORS budget: one layer's write through the same CudaTransport, the same blocks,"
              + " submit -> done seen, p50 %.1f us; last layer's event -> D done p50 %.1f us:"
              + " %.2fx one layer (goal <= 1.0x), %.1f us more; p99 %.1f us: %.2fx one layer%n",
          layerUs, tailP50, tailP50 / layerUs, tailP50 - layerUs, tailP99, tailP99 / layerUs);
      System.out.printf(Locale.ROOT,
          "ACTORS D's done-word watcher: %.1f ms of CPU in the %.1f ms of timed requests (%.0f%%"
              + " of one core)%n", watcherCpuMs, timedMs, 100 * watcherCpuMs / timedMs);
      // Without a warm-up the first request runs cold (JIT, serializers, handshake): left out.
      int from = warmup > 0 ? 0 : Math.min(1, stages.size() - 1);
      System.out.printf(Locale.ROOT,
          "ACTORS stages, median us after the poller saw the last layer's event (timed requests"
              + " %d to %d, after %d untimed): %s%n", from + 1, stages.size(), warmup,
          StageMedians.describe(STAGE_NAMES,
              stages.subList(from, stages.size()).toArray(double[][]::new)));
      pWorker.shutdown();
      dWorker.shutdown();
    } catch (RuntimeException e) {
      ok = false;
      System.out.println("ACTORS run failed: " + e);
      e.printStackTrace(System.out);
    } finally {
      pSystem.terminate();
      dSystem.terminate();
      pSystem.getWhenTerminated().toCompletableFuture().get();
      dSystem.getWhenTerminated().toCompletableFuture().get();
      pTransport.close();
      dTransport.close();
      pKv.close();
      dKv.close();
    }
    return ok;
  }

  /**
   * One layer's write of the request's blocks (P's layer 0 to D's), submitted and spun on until
   * its status is done: the goal's "one layer's transfer", timed in this run. Median of 50 after
   * 10 untimed.
   */
  private static double oneLayersWrite(CudaTransport p, CudaTransport d, GpuKvLayers pKv,
      GpuKvLayers dKv, int[] pIds, int[] dIds) {
    long[] sizes = new long[2 * pIds.length];
    java.util.Arrays.fill(sizes, pKv.blockBytes);
    TransferBatch batch = new TransferBatch(pKv.slotOffsets(pIds), dKv.slotOffsets(dIds), sizes);
    RegionDescriptor remote = d.describe(dKv.regions.get(0));
    List<Double> us = new ArrayList<>();
    for (int i = 0; i < 60; i++) {
      long start = System.nanoTime();
      TransferStatus s = p.write(pKv.regions.get(0), remote, batch);
      while (!s.isDone()) {
        Thread.onSpinWait();
      }
      long end = System.nanoTime();
      if (!s.succeeded()) {
        throw new IllegalStateException("one layer's write failed: " + s.failureMessage());
      }
      if (i >= 10) {
        us.add((end - start) / 1e3);
      }
    }
    return Samples.median(us);
  }

  /**
   * Where the last layer's write spent its time ({@link WriteStamps}: the latest mark of each
   * stage; every layer is saved at once, so per-layer stages are the last layer the writer or
   * its I/O pool reached). Negative: before the poller saw the event (the CPU runs ahead of the
   * GPU).
   */
  private static final String[] STAGE_NAMES = {
      "D's blocks announced", "D told its blocks", "P's engine actor took them",
      "P's writer took them", "last save returned", "waitForSave returned",
      "save seen", "io started", "write returned", "done word queued", "done word task",
      "done word queued on the stream", "last layer written seen", "WriteDone sent",
      "D word seen", "D writer done seen", "D done"};

  private static double[] stages(
      long lastEventSeen, long announced, long lastSaveReturned, long waitedForSave, long dDone) {
    long[] at = {
        announced,
        WriteStamps.nanos(WriteStamps.Stage.BLOCKS_TOLD),
        WriteStamps.nanos(WriteStamps.Stage.BLOCKS_ARRIVED),
        WriteStamps.nanos(WriteStamps.Stage.BLOCKS_SEEN),
        lastSaveReturned,
        waitedForSave,
        WriteStamps.nanos(WriteStamps.Stage.SAVE_SEEN),
        WriteStamps.nanos(WriteStamps.Stage.IO_STARTED),
        WriteStamps.nanos(WriteStamps.Stage.SUBMIT_RETURNED),
        WriteStamps.nanos(WriteStamps.Stage.DONE_WORD_QUEUED),
        WriteStamps.nanos(WriteStamps.Stage.DONE_WORD_TASK),
        WriteStamps.nanos(WriteStamps.Stage.DONE_WORD_STORED),
        WriteStamps.nanos(WriteStamps.Stage.WRITTEN_SEEN),
        WriteStamps.nanos(WriteStamps.Stage.WRITE_DONE_SENT),
        WriteStamps.nanos(WriteStamps.Stage.DONE_WORD_SEEN),
        WriteStamps.nanos(WriteStamps.Stage.WRITER_DONE_SEEN),
        dDone};
    double[] us = new double[at.length];
    for (int i = 0; i < at.length; i++) {
      us[i] = at[i] == 0 ? Double.NaN : (at[i] - lastEventSeen) / 1e3;
    }
    return us;
  }

  /** CPU time so far of the done-word watchers' threads (D's, here; P has none). */
  private static long watcherCpuNanos() {
    java.lang.management.ThreadMXBean mx = java.lang.management.ManagementFactory.getThreadMXBean();
    long sum = 0;
    for (java.lang.management.ThreadInfo t : mx.getThreadInfo(mx.getAllThreadIds())) {
      if (t != null && t.getThreadName().startsWith("kvferry-done-words-")) {
        sum += Math.max(0, mx.getThreadCpuTime(t.getThreadId()));
      }
    }
    return sum;
  }

  /** Waits until {@code system}'s receptionist lists an engine of {@code role} (gossip). */
  private static void awaitListed(ActorSystem<Void> system, Role role) throws Exception {
    long deadline = System.nanoTime() + 60_000_000_000L;
    while (true) {
      Receptionist.Listing listing = AskPattern.<Receptionist.Command, Receptionist.Listing>ask(
              system.receptionist(),
              replyTo -> Receptionist.find(EngineActor.serviceKey(role), replyTo),
              Duration.ofSeconds(3), system.scheduler())
          .toCompletableFuture().get();
      if (!listing.getServiceInstances(EngineActor.serviceKey(role)).isEmpty()) {
        return;
      }
      if (System.nanoTime() > deadline) {
        throw new IllegalStateException("no " + role + " engine listed in 60 s");
      }
      Thread.sleep(50);
    }
  }

  /** Spins on D's getFinished until {@code id} is received; the time seen. Fails on failure. */
  private static long awaitReceived(ConnectorWorker d, String id, long timeoutNs) {
    return await(d, id, timeoutNs, true);
  }

  private static void awaitSent(ConnectorWorker p, String id, long timeoutNs) {
    await(p, id, timeoutNs, false);
  }

  private static long await(ConnectorWorker w, String id, long timeoutNs, boolean receiving) {
    long start = System.nanoTime();
    Set<String> seen = new HashSet<>();
    while (true) {
      Finished f = w.getFinished();
      long now = System.nanoTime();
      if (f.failed().containsKey(id)) {
        throw new IllegalStateException(id + " failed on " + w.identity().label() + ": "
            + f.failed().get(id));
      }
      seen.addAll(receiving ? f.doneReceiving() : f.doneSending());
      if (seen.contains(id)) {
        return now;
      }
      if (now - start > timeoutNs) {
        throw new IllegalStateException(id + " not finished on " + w.identity().label()
            + " within " + timeoutNs / 1_000_000_000 + " s");
      }
      Thread.onSpinWait();
    }
  }
}
