package dev.kvferry.bench.gpu;

import com.sun.jna.Memory;
import com.sun.jna.Pointer;
import dev.kvferry.rdma.CudaTransport;
import dev.kvferry.rdma.MalformedDescriptorException;
import dev.kvferry.rdma.RegionDescriptor;
import dev.kvferry.rdma.RegionRegistry;
import dev.kvferry.rdma.TransferBatch;
import dev.kvferry.rdma.TransferStatus;
import dev.kvferry.rdma.testing.ChildJvm;
import dev.kvferry.rdma.cuda.Cuda;
import dev.kvferry.rdma.cuda.CudaEvent;
import dev.kvferry.rdma.cuda.CudaEventPoller;
import dev.kvferry.sim.SimKernels;
import dev.kvferry.rdma.cuda.CudaStream;
import dev.kvferry.rdma.cuda.SharedDoneWords;
import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HexFormat;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Random;
import java.util.concurrent.atomic.AtomicLong;
import java.util.stream.Collectors;

/**
 * P and D as two JVM processes on GPUs of one host, moving a Llama-3-8B-like KV cache (32 layers,
 * 16-token blocks of 32 KiB per K or V) through {@link CudaTransport}: WRITE (P pushes into D's
 * IPC-opened blocks) and READ (D pulls from P's), contiguous and scattered block ids, each copy
 * method, every byte checked on D by a kernel. Then the overlap run: each layer's "compute" (the
 * pattern fill plus a spin) runs on P's compute stream, its copies are ordered behind the layer's
 * event with {@link CudaTransport#writeAfter}, and the time from the last layer's event to D's done
 * is compared with one layer's transfer time. This process is P; it starts D as a child.
 *
 * <p>Usage: {@code GpuTransferBench --p-gpu 0 --d-gpu 1 [--layers 32] [--blocks 2048] [--capacity
 * 4096] [--block-bytes 32768] [--reps 5] [--spin-us 300] [--out DIR]}. Writes {@code
 * kvferry-gpu.json} (and the block ids, for the PyTorch peer) under {@code --out}.
 */
public final class GpuTransferBench {

  private static final Duration REPLY = Duration.ofMinutes(3);
  private static final HexFormat HEX = HexFormat.of();

  private GpuTransferBench() {}

  public static void main(String[] args) throws Exception {
    if (args.length > 0 && args[0].equals("d")) {
      decode(args);
      return;
    }
    Map<String, String> o = options(args);
    int pGpu = Integer.parseInt(o.getOrDefault("p-gpu", "0"));
    int dGpu = Integer.parseInt(o.getOrDefault("d-gpu", "0"));
    int layers = Integer.parseInt(o.getOrDefault("layers", "32"));
    int blocks = Integer.parseInt(o.getOrDefault("blocks", "2048"));
    int capacity = Integer.parseInt(o.getOrDefault("capacity", "4096"));
    long blockBytes = Long.parseLong(o.getOrDefault("block-bytes", "32768"));
    int reps = Integer.parseInt(o.getOrDefault("reps", "5"));
    long spinNs = Long.parseLong(o.getOrDefault("spin-us", "300")) * 1000;
    int samples = Integer.parseInt(o.getOrDefault("overlap-samples", "9"));
    Path out = Path.of(o.getOrDefault("out", "."));
    Files.createDirectories(out);
    if (!Cuda.available()) {
      System.err.println("CUDA not available: " + Cuda.unavailableReason());
      System.exit(2);
    }
    new Prefill(pGpu, dGpu, layers, blocks, capacity, blockBytes, reps, spinNs, samples, out).run();
  }

  private static Map<String, String> options(String[] args) {
    Map<String, String> o = new LinkedHashMap<>();
    for (int i = 0; i + 1 < args.length; i += 2) {
      if (!args[i].startsWith("--")) {
        throw new IllegalArgumentException("expected --name value, got " + args[i]);
      }
      o.put(args[i].substring(2), args[i + 1]);
    }
    return o;
  }

  // ---- shared by P and D ----------------------------------------------------------------------

  /** Entries of a request's copy: one per block (K and V), merged where both sides run on. */
  static TransferBatch plan(long[] localSlots, long[] remoteSlots, long blockBytes) {
    List<long[]> runs = new ArrayList<>();
    for (int i = 0; i < localSlots.length; i++) {
      long[] last = runs.isEmpty() ? null : runs.get(runs.size() - 1);
      if (last != null && last[0] + last[2] == localSlots[i] && last[1] + last[2] == remoteSlots[i]) {
        last[2] += blockBytes;
      } else {
        runs.add(new long[] {localSlots[i], remoteSlots[i], blockBytes});
      }
    }
    long[] l = new long[runs.size()];
    long[] r = new long[runs.size()];
    long[] s = new long[runs.size()];
    for (int i = 0; i < runs.size(); i++) {
      l[i] = runs.get(i)[0];
      r[i] = runs.get(i)[1];
      s[i] = runs.get(i)[2];
    }
    return new TransferBatch(l, r, s);
  }

  /** Mismatched 32-bit words over all layers of the request's blocks, checked by a kernel. */
  public static long verify(GpuKvLayers kv, int[] blockIds, int seed) {
    long[] slots = kv.slotOffsets(blockIds);
    long offsets = kv.upload(slots);
    Cuda.setDevice(kv.device);
    long counter = Cuda.malloc(8);
    Cuda.memset(counter, 0, 8);
    SimKernels k = SimKernels.forDevice(kv.device);
    try (CudaStream s = CudaStream.create(kv.device); Memory host = new Memory(8)) {
      for (int l = 0; l < kv.layers; l++) {
        k.verifyPattern(s, kv.regions.get(l).address(), offsets, slots.length, kv.blockBytes, l,
            seed, counter);
      }
      s.synchronize();
      Cuda.memcpy(Pointer.nativeValue(host), counter, 8);
      return host.getLong(0);
    } finally {
      Cuda.free(counter);
      Cuda.free(offsets);
    }
  }

  /** Runs all layers' copies {@code reps} times after one warm-up; median ns of a pass. */
  static long timeAllLayers(
      CudaTransport t, GpuKvLayers kv, List<RegionDescriptor> peer, TransferBatch batch,
      boolean write, int reps, int layersPerPass) {
    long[] ns = new long[reps];
    for (int r = -1; r < reps; r++) {
      long t0 = System.nanoTime();
      List<TransferStatus> statuses = new ArrayList<>(layersPerPass);
      for (int l = 0; l < layersPerPass; l++) {
        statuses.add(write
            ? t.write(kv.regions.get(l), peer.get(l), batch)
            : t.read(kv.regions.get(l), peer.get(l), batch));
      }
      awaitAll(statuses);
      if (r >= 0) {
        ns[r] = System.nanoTime() - t0;
      }
    }
    Arrays.sort(ns);
    return ns[reps / 2];
  }

  /**
   * Spins until every status is terminal: the bench times the transport, not how fast the JVM
   * wakes a parked thread (tens of microseconds in a VM).
   */
  static void awaitAll(List<TransferStatus> statuses) {
    for (TransferStatus s : statuses) {
      while (!s.isDone()) {
        Thread.onSpinWait();
      }
    }
    for (TransferStatus s : statuses) {
      if (!s.succeeded()) {
        throw new IllegalStateException("transfer failed: " + s.failureMessage());
      }
    }
  }

  static CudaTransport transport(String method) {
    return new CudaTransport(CudaTransport.CopyMethod.valueOf(method));
  }

  static List<String> methods() {
    return Cuda.hasMemcpyBatch() ? List.of("KERNEL", "MEMCPY_BATCH") : List.of("KERNEL");
  }

  static String packAll(CudaTransport t, GpuKvLayers kv) {
    return kv.regions.stream().map(r -> HEX.formatHex(t.describe(r).pack()))
        .collect(Collectors.joining(","));
  }

  static List<RegionDescriptor> unpackAll(String hexes) throws MalformedDescriptorException {
    List<RegionDescriptor> out = new ArrayList<>();
    for (String h : hexes.split(",")) {
      out.add(RegionDescriptor.unpack(HEX.parseHex(h)));
    }
    return out;
  }

  static String csv(int[] ids) {
    return Arrays.stream(ids).mapToObj(Integer::toString).collect(Collectors.joining(","));
  }

  static int[] parseCsv(String s) {
    return Arrays.stream(s.split(",")).mapToInt(Integer::parseInt).toArray();
  }

  // ---- D: the child process -------------------------------------------------------------------

  private static void decode(String[] args) throws Exception {
    int gpu = Integer.parseInt(args[1]);
    int layers = Integer.parseInt(args[2]);
    int capacity = Integer.parseInt(args[3]);
    long blockBytes = Long.parseLong(args[4]);
    Cuda.setDevice(gpu);
    RegionRegistry registry = new RegionRegistry("decode");
    GpuKvLayers kv = new GpuKvLayers(registry, gpu, layers, capacity, blockBytes);
    Map<String, CudaTransport> transports = new LinkedHashMap<>();
    for (String m : methods()) {
      transports.put(m, transport(m));
    }
    List<RegionDescriptor> prefill = List.of();
    Path shm = Files.isDirectory(Path.of("/dev/shm")) ? Path.of("/dev/shm")
        : Path.of(System.getProperty("java.io.tmpdir"));
    SharedDoneWords words =
        SharedDoneWords.create(shm, "kvferry-gpu-bench-" + ProcessHandle.current().pid(), 2);
    System.out.println("READY " + packAll(transports.get("KERNEL"), kv));
    System.out.flush();
    BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
    String line;
    while ((line = in.readLine()) != null) {
      String[] w = line.split(" ");
      switch (w[0]) {
        case "DONE" -> System.out.println("DONEAT " + System.nanoTime());
        case "WORDS" -> System.out.println("WORDS " + words.path());
        case "AWAIT" -> {
          // Spin on the two words P's GPU streams store: its last layer's compute finished
          // (slot 0), then its copies into this process's memory landed (slot 1).
          long seq = Long.parseLong(w[1]);
          long timeoutNs = Duration.ofSeconds(20).toNanos();
          long computeDone = words.awaitAtLeast(0, seq, timeoutNs);
          long copiesDone = words.awaitAtLeast(1, seq, timeoutNs);
          System.out.println("AWAITED " + computeDone + " " + copiesDone);
        }
        case "PEER" -> {
          prefill = unpackAll(w[1]);
          System.out.println("OK");
        }
        case "CLEAR" -> {
          kv.clear();
          System.out.println("OK");
        }
        case "VERIFY" -> System.out.println(
            "VERIFIED " + verify(kv, parseCsv(w[2]), Integer.parseInt(w[1])));
        case "READ" -> {
          CudaTransport t = transports.get(w[1]);
          int reps = Integer.parseInt(w[2]);
          int seed = Integer.parseInt(w[3]);
          int[] pIds = parseCsv(w[4]);
          int[] dIds = parseCsv(w[5]);
          kv.clear();
          TransferBatch batch =
              plan(kv.slotOffsets(dIds), kv.slotOffsets(pIds), kv.blockBytes);
          long all = timeAllLayers(t, kv, prefill, batch, false, reps, layers);
          long one = timeAllLayers(t, kv, prefill, batch, false, reps, 1);
          long bad = verify(kv, dIds, seed);
          System.out.println("READRESULT " + all + " " + one + " " + bad + " " + batch.count());
        }
        case "QUIT" -> {
          words.close();
          for (CudaTransport t : transports.values()) {
            t.close();
          }
          kv.close();
          System.out.println("BYE");
          System.out.flush();
          return;
        }
        default -> System.out.println("ERROR unknown command " + w[0]);
      }
      System.out.flush();
    }
  }

  // ---- P: this process ------------------------------------------------------------------------

  private record Result(
      String mode, String layout, String method, int entries, long bytes, long passNs,
      long layerNs, long mismatches) {
    double gbps() {
      return bytes / (double) passNs;
    }

    String json() {
      return String.format(Locale.ROOT,
          "{\"mode\":\"%s\",\"layout\":\"%s\",\"method\":\"%s\",\"entries_per_layer\":%d,"
              + "\"bytes\":%d,\"pass_ns\":%d,\"one_layer_ns\":%d,\"gbps\":%.2f,"
              + "\"mismatched_words\":%d}",
          mode, layout, method, entries, bytes, passNs, layerNs, gbps(), mismatches);
    }
  }

  private static final class Prefill {
    final int pGpu;
    final int dGpu;
    final int layers;
    final int blocks;
    final int capacity;
    final long blockBytes;
    final int reps;
    final long spinNs;
    final int samples;
    final Path out;
    SharedDoneWords doneWords;
    long sequence;
    final List<Result> results = new ArrayList<>();
    final List<String> overlap = new ArrayList<>();

    Prefill(int pGpu, int dGpu, int layers, int blocks, int capacity, long blockBytes, int reps,
        long spinNs, int samples, Path out) {
      this.samples = samples;
      this.pGpu = pGpu;
      this.dGpu = dGpu;
      this.layers = layers;
      this.blocks = blocks;
      this.capacity = capacity;
      this.blockBytes = blockBytes;
      this.reps = reps;
      this.spinNs = spinNs;
      this.out = out;
    }

    void run() throws Exception {
      if (2L * blocks > capacity) {
        // The scattered rows pick their ids out of a pool at least twice their count (as a D
        // in use hands out a subset of a larger cache), so few neighbours merge.
        throw new IllegalArgumentException("--capacity " + capacity + " must be at least twice"
            + " --blocks " + blocks);
      }
      Cuda.setDevice(pGpu);
      System.out.printf(Locale.ROOT, "kvferry GPU bench: P on GPU %d (%s), D on GPU %d (%s), CUDA runtime %d%n",
          pGpu, Cuda.deviceName(pGpu), dGpu, Cuda.deviceName(dGpu), Cuda.runtimeVersion());
      if (pGpu != dGpu) {
        System.out.println("peer access " + pGpu + "->" + dGpu + ": " + Cuda.canAccessPeer(pGpu, dGpu));
      }
      RegionRegistry registry = new RegionRegistry("prefill");
      GpuKvLayers kv = new GpuKvLayers(registry, pGpu, layers, capacity, blockBytes);
      Map<String, CudaTransport> transports = new LinkedHashMap<>();
      for (String m : methods()) {
        transports.put(m, transport(m));
      }
      List<String> jvm = new ArrayList<>();
      for (String p : System.getProperties().stringPropertyNames()) {
        if (p.startsWith("kvferry.") || p.startsWith("jna.")) {
          jvm.add("-D" + p + "=" + System.getProperty(p));
        }
      }
      try (ChildJvm d = ChildJvm.start(GpuTransferBench.class.getName(), jvm,
          List.of("d", Integer.toString(dGpu), Integer.toString(layers),
              Integer.toString(capacity), Long.toString(blockBytes)))) {
        List<RegionDescriptor> decode = unpackAll(d.awaitLine("READY", REPLY));
        d.request("PEER " + packAll(transports.get("KERNEL"), kv), "OK", REPLY);
        try {
          doneWords = SharedDoneWords.openForGpuWrites(
              Path.of(d.request("WORDS", "WORDS", REPLY)), 2);
        } catch (RuntimeException e) {
          System.out.println("done words unavailable, D learns through the pipe only: " + e);
        }
        Random random = new Random(42);
        String[] layouts = {"contiguous", "scattered"};
        for (int li = 0; li < layouts.length; li++) {
          String layout = layouts[li];
          int[] pIds = new int[blocks];
          int[] dIds = new int[blocks];
          if (layout.equals("contiguous")) {
            for (int i = 0; i < blocks; i++) {
              pIds[i] = i;
              dIds[i] = capacity - blocks + i;
            }
          } else {
            pIds = pick(random, capacity, blocks);
            dIds = pick(random, capacity, blocks);
          }
          Files.writeString(out.resolve("ids-" + layout + ".txt"), csv(pIds) + "\n" + csv(dIds) + "\n");
          int seed = 1000 + li;
          fill(kv, pIds, seed, 0, null);
          long bytes = (long) layers * 2 * blocks * blockBytes;
          TransferBatch batch = plan(kv.slotOffsets(pIds), kv.slotOffsets(dIds), blockBytes);
          for (var e : transports.entrySet()) {
            d.request("CLEAR", "OK", REPLY);
            long all = timeAllLayers(e.getValue(), kv, decode, batch, true, reps, layers);
            long one = timeAllLayers(e.getValue(), kv, decode, batch, true, reps, 1);
            long bad = Long.parseLong(d.request("VERIFY " + seed + " " + csv(dIds), "VERIFIED", REPLY));
            add(new Result("WRITE", layout, e.getKey(), batch.count(), bytes, all, one, bad));
          }
          for (String m : transports.keySet()) {
            String[] r = d.request("READ " + m + " " + reps + " " + seed + " " + csv(pIds) + " "
                + csv(dIds), "READRESULT", REPLY).split(" ");
            add(new Result("READ", layout, m, Integer.parseInt(r[3]), bytes, Long.parseLong(r[0]),
                Long.parseLong(r[1]), Long.parseLong(r[2])));
          }
          for (var e : transports.entrySet()) {
            overlapRun(d, kv, decode, e.getKey(), e.getValue(), layout, pIds, dIds, batch,
                seed + 100);
          }
        }
        d.request("QUIT", "BYE", REPLY);
      }
      for (CudaTransport t : transports.values()) {
        t.close();
      }
      if (doneWords != null) {
        doneWords.close();
      }
      kv.close();
      String json = "{\"p_gpu\":" + pGpu + ",\"d_gpu\":" + dGpu + ",\"gpu\":\""
          + Cuda.deviceName(pGpu) + "\",\"layers\":" + layers + ",\"blocks\":" + blocks
          + ",\"capacity\":" + capacity + ",\"block_bytes\":" + blockBytes + ",\"reps\":" + reps + ",\"spin_us\":"
          + spinNs / 1000 + ",\n\"results\":[\n"
          + results.stream().map(Result::json).collect(Collectors.joining(",\n"))
          + "],\n\"overlap\":[\n" + String.join(",\n", overlap) + "]}\n";
      Files.writeString(out.resolve("kvferry-gpu.json"), json);
      System.out.println("wrote " + out.resolve("kvferry-gpu.json"));
    }

    private void add(Result r) {
      results.add(r);
      System.out.printf(Locale.ROOT,
          "%-5s %-10s %-12s entries/layer=%5d  %7.1f GB/s  pass %8.3f ms  one layer %7.1f us  mismatched words %d%n",
          r.mode(), r.layout(), r.method(), r.entries(), r.gbps(), r.passNs() / 1e6,
          r.layerNs() / 1e3, r.mismatches());
      if (r.mismatches() != 0) {
        System.out.println("VERIFY FAILED: " + r.mismatches() + " words differ at D");
      }
    }

    /** The pattern of {@code seed} into the request's blocks of every layer, on {@code stream}. */
    private void fill(GpuKvLayers kv, int[] pIds, int seed, long spin, CudaStream stream) {
      long[] slots = kv.slotOffsets(pIds);
      long offsets = kv.upload(slots);
      SimKernels k = SimKernels.forDevice(kv.device);
      try (CudaStream s = CudaStream.create(kv.device)) {
        for (int l = 0; l < kv.layers; l++) {
          k.fillPattern(s, kv.regions.get(l).address(), offsets, slots.length, kv.blockBytes, l,
              seed, spin, k.multiProcessors());
        }
        s.synchronize();
      } finally {
        Cuda.free(offsets);
      }
    }

    /**
     * Each layer's compute (fill + spin) on the compute stream, its write queued at once behind
     * the layer's event: how long after the last layer's compute is D done? Two ways for D to
     * learn, {@link #samples} times each, alternating: "pipe" (the poller completes P's statuses,
     * then P tells D over its stdin, as a message would) and "word" (P's copy stream stores a
     * sequence number into D's shared done word behind the copies; D spins on it, and on the word
     * P's compute stream stores after the last layer, so both ends are seen by one spinning CPU).
     */
    private void overlapRun(ChildJvm d, GpuKvLayers kv, List<RegionDescriptor> decode,
        String method, CudaTransport t, String layout, int[] pIds, int[] dIds, TransferBatch batch,
        int seed) throws IOException {
      long[] slots = kv.slotOffsets(pIds);
      long offsets = kv.upload(slots);
      SimKernels k = SimKernels.forDevice(kv.device);
      List<CudaEvent> events = new ArrayList<>();
      for (int l = 0; l < kv.layers; l++) {
        events.add(CudaEvent.create(kv.device, true));
      }
      CudaEvent start = CudaEvent.create(kv.device, true);
      int last = kv.layers - 1;
      try (CudaStream compute = CudaStream.create(kv.device)) {
        // Compute alone first: the layers' time without transfers.
        start.record(compute);
        for (int l = 0; l < kv.layers; l++) {
          k.fillPattern(compute, kv.regions.get(l).address(), offsets, slots.length, kv.blockBytes,
              l, seed, spinNs, k.multiProcessors());
          events.get(l).record(compute);
        }
        compute.synchronize();
        float computeAlone = events.get(last).elapsedMsSince(start);
        List<Double> pipeTail = new ArrayList<>();
        List<Double> wordTail = new ArrayList<>();
        List<Double> pLag = new ArrayList<>();
        List<Double> computeWith = new ArrayList<>();
        long bad = 0;
        for (int sample = 0; sample < 2 * samples; sample++) {
          boolean word = sample % 2 == 1;
          if (word && doneWords == null) {
            continue;
          }
          long seq = ++sequence;
          d.request("CLEAR", "OK", REPLY);
          if (word) {
            d.send("AWAIT " + seq);
          }
          AtomicLong lastEventSeen = new AtomicLong();
          List<TransferStatus> statuses = new ArrayList<>();
          start.record(compute);
          for (int l = 0; l < kv.layers; l++) {
            k.fillPattern(compute, kv.regions.get(l).address(), offsets, slots.length,
                kv.blockBytes, l, seed, spinNs, k.multiProcessors());
            events.get(l).record(compute);
            statuses.add(t.writeAfter(events.get(l), kv.regions.get(l), decode.get(l), batch));
          }
          if (word) {
            Cuda.streamWriteValue64(compute.handle(), doneWords.deviceAddress(0), seq);
            t.signalWhenCopied(kv.regions.get(last), decode.get(last),
                doneWords.deviceAddress(1), seq);
          }
          CudaEventPoller.common().watch(events.get(last),
              () -> lastEventSeen.set(System.nanoTime()), e -> { });
          awaitAll(statuses);
          long pDone = System.nanoTime();
          while (lastEventSeen.get() == 0) {
            Thread.onSpinWait();
          }
          if (word) {
            String[] r = d.awaitLine("AWAITED", REPLY).split(" ");
            long computeDone = Long.parseLong(r[0]);
            long copiesDone = Long.parseLong(r[1]);
            if (computeDone < 0 || copiesDone < 0) {
              throw new IllegalStateException("D never saw the done words (" + String.join(" ", r) + ")");
            }
            wordTail.add((copiesDone - computeDone) / 1e3);
          } else {
            long dDone = Long.parseLong(d.request("DONE", "DONEAT", REPLY));
            pipeTail.add((dDone - lastEventSeen.get()) / 1e3);
          }
          pLag.add((pDone - lastEventSeen.get()) / 1e3);
          compute.synchronize();
          computeWith.add((double) events.get(last).elapsedMsSince(start) * 1000);
          bad += Long.parseLong(d.request("VERIFY " + seed + " " + csv(dIds), "VERIFIED", REPLY));
        }
        long layerNs = results.stream()
            .filter(r -> r.mode().equals("WRITE") && r.layout().equals(layout)
                && r.method().equals(method))
            .mapToLong(Result::layerNs).findFirst().orElse(0);
        double layerUs = layerNs / 1e3;
        double pipe = median(pipeTail);
        double wordUs = median(wordTail);
        String json = String.format(Locale.ROOT,
            "{\"layout\":\"%s\",\"method\":\"%s\",\"spin_us\":%d,\"samples\":%d,"
                + "\"compute_alone_us\":%.1f,\"compute_with_transfers_us_p50\":%.1f,"
                + "\"last_event_to_p_done_us_p50\":%.1f,"
                + "\"last_event_to_d_done_us\":%.1f,"
                + "\"pipe_tail_us\":%s,\"word_tail_us\":%s,"
                + "\"last_event_to_d_done_word_us\":%.1f,\"one_layer_transfer_us\":%.1f,"
                + "\"tail_over_layer\":%.2f,\"pipe_tail_over_layer\":%.2f,"
                + "\"mismatched_words\":%d}",
            layout, method, spinNs / 1000, samples, computeAlone * 1000, median(computeWith),
            median(pLag), pipe, list(pipeTail), list(wordTail), wordUs, layerUs,
            layerNs == 0 || wordTail.isEmpty() ? 0.0 : wordUs / layerUs,
            layerNs == 0 ? 0.0 : pipe / layerUs, bad);
        overlap.add(json);
        System.out.printf(Locale.ROOT,
            "OVERLAP %-10s %-12s compute %.0f us alone, %.0f us with transfers (p50); "
                + "last layer -> P done %.1f us; "
                + "-> D done: pipe %.1f us, done word %.1f us (p50 of %d); one layer %.1f us; "
                + "ratio word %.2f pipe %.2f; mismatched words %d%n",
            layout, method, computeAlone * 1000, median(computeWith), median(pLag), pipe, wordUs,
            samples, layerUs, layerNs == 0 ? 0.0 : wordUs / layerUs,
            layerNs == 0 ? 0.0 : pipe / layerUs, bad);
        if (bad != 0) {
          System.out.println("VERIFY FAILED: " + bad + " words differ at D");
        }
      } finally {
        for (CudaEvent e : events) {
          e.close();
        }
        start.close();
        Cuda.free(offsets);
      }
    }

    private static double median(List<Double> xs) {
      if (xs.isEmpty()) {
        return Double.NaN;
      }
      List<Double> sorted = new ArrayList<>(xs);
      java.util.Collections.sort(sorted);
      return sorted.get(sorted.size() / 2);
    }

    private static String list(List<Double> xs) {
      return xs.stream().map(x -> String.format(Locale.ROOT, "%.1f", x))
          .collect(Collectors.joining(",", "[", "]"));
    }

    private static int[] pick(Random random, int capacity, int n) {
      List<Integer> all = new ArrayList<>();
      for (int i = 0; i < capacity; i++) {
        all.add(i);
      }
      java.util.Collections.shuffle(all, random);
      return all.subList(0, n).stream().mapToInt(Integer::intValue).toArray();
    }
  }
}
