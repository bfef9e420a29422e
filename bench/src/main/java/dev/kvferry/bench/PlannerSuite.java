package dev.kvferry.bench;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import dev.kvferry.actors.plan.BlockIdSamples;
import dev.kvferry.actors.plan.InvalidBlockIdsException;
import dev.kvferry.actors.plan.KvCacheGeometry;
import dev.kvferry.actors.plan.TransferPlanner;
import dev.kvferry.rdma.TransferBatch;
import java.io.IOException;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Random;

/**
 * The transfer planner against the seed's numpy planner (kvferry's peer seed_planner.py --bench) on
 * the same request: {@code n} scattered block ids on both sides out of a cache of {@code 2n}
 * blocks (an allocator in use hands out scattered ids), Llama-3-8B geometry. The seed reports the
 * median of its 5 rounds (in its own process), run 3 times; kvferry's planner runs in this JVM
 * after a 2 s warm-up, 3 rounds before, between and after the seed's runs; each side reports the
 * median of all of its own. The two plans are compared, so both did the same work: a row whose
 * plans differ fails.
 */
public final class PlannerSuite {

  public static final int[] BLOCK_COUNTS = {128, 1024, 8192};
  public static final double GOAL = 30.0;
  /** kvferry's rounds per turn, between the seed's runs. */
  private static final int ROUNDS = 3;
  /** Runs of the seed's planner (each the median of its own 5 rounds), alternated with kvferry's. */
  private static final int SEED_RUNS = 3;

  @SuppressWarnings("unused")
  private static volatile long sink;

  private final PeerTools peers;
  private final int[] blockCounts;
  private final long warmupNanos;
  private final PrintStream progress;

  /** The published sizes ({@link #BLOCK_COUNTS}) after a 2 s warm-up. */
  public PlannerSuite(PeerTools peers, PrintStream progress) {
    this(peers, BLOCK_COUNTS, 2_000_000_000L, progress);
  }

  /**
   * @param blockCounts the request sizes, one row each
   * @param warmupNanos how long kvferry's planner runs before its timed rounds
   */
  public PlannerSuite(PeerTools peers, int[] blockCounts, long warmupNanos, PrintStream progress) {
    this.peers = peers;
    this.blockCounts = blockCounts.clone();
    this.warmupNanos = warmupNanos;
    this.progress = progress;
  }

  public List<BenchRow> run() {
    List<BenchRow> rows = new ArrayList<>();
    String python = null;
    java.nio.file.Path script = null;
    String missing = "";
    try {
      script = peers.peerFile("seed_planner.py");
      python = peers.pythonWithNumpy();
    } catch (PeerTools.MissingPeerException e) {
      missing = e.getMessage();
    }
    for (int n : blockCounts) {
      progress.printf("  planner, %,d blocks%n", n);
      Request req = request(n, 42 + n);
      String note = missing;
      String failure = null;
      Double kvferry = null;
      Double seed = null;
      TransferPlanner planner = new TransferPlanner();
      TransferPlan timing = null;
      try {
        // kvferry's rounds and the seed's runs alternate, so a shared machine whose speed changes
        // during the suite weighs on both alike; each side reports the median of all of its
        // rounds (the seed's: of its runs' medians).
        timing = new TransferPlan(planner, req, warmupNanos);
        List<Double> seedMicros = new ArrayList<>();
        boolean seedRuns = true; // until it fails or its plan differs
        for (int a = 0; a < SEED_RUNS; a++) {
          timing.rounds(ROUNDS);
          if (python == null || !seedRuns || failure != null) {
            continue;
          }
          try {
            SeedResult s = seed(python, script, req);
            seedMicros.add(s.secondsPerCall * 1e6);
            if (!s.plan.equals(timing.plan)) {
              failure = "the seed's plan differs from kvferry's (" + s.plan + " vs " + timing.plan
                  + ")";
            }
          } catch (IOException | RuntimeException e) {
            note = "seed_planner.py failed: " + e.getMessage();
            seedRuns = false;
          }
        }
        timing.rounds(ROUNDS);
        kvferry = timing.medianSecondsPerCall() * 1e6;
        seed = seedRuns && !seedMicros.isEmpty() ? Samples.median(seedMicros) : null;
      } catch (InvalidBlockIdsException e) {
        failure = "kvferry refused the request: " + e.getMessage();
      }
      BenchRow row = BenchRow.lowerIsBetter(String.format("planner %,d blocks", n), "us/plan",
          kvferry, seed, GOAL, note);
      rows.add(failure == null ? row : row.failedBecause(failure));
    }
    return rows;
  }

  record Request(KvCacheGeometry geometry, int[] local, int[] remote) {}

  static Request request(int n, long seed) {
    KvCacheGeometry g = KvCacheGeometry.standard(2 * n, Geometry.BLOCK_TOKENS, Geometry.KV_HEADS,
        Geometry.HEAD_DIM, Geometry.ELEMENT_BYTES);
    Random r = new Random(seed);
    return new Request(g, BlockIdSamples.distinct(r, n, 2 * n), BlockIdSamples.distinct(r, n, 2 * n));
  }


  /** Times kvferry's planner on one request: warmed up, then rounds of >= 50 ms. */
  private static final class TransferPlan {
    private final TransferPlanner planner;
    private final Request req;
    private final TransferBatch plan;
    private final int callsPerRound;
    private final List<Double> secondsPerCall = new ArrayList<>();

    TransferPlan(TransferPlanner planner, Request req, long warmupNanos)
        throws InvalidBlockIdsException {
      this.planner = planner;
      this.req = req;
      this.plan = planOnce();
      long s = 0;
      int calls = 0;
      long t0 = System.nanoTime();
      long warmEnd = t0 + warmupNanos;
      do {
        s += planOnce().count();
        calls++;
      } while (System.nanoTime() < warmEnd);
      sink = s;
      double perCallNs = (System.nanoTime() - t0) / (double) calls;
      callsPerRound = (int) Math.max(10, 50_000_000L / perCallNs);
    }

    private TransferBatch planOnce() throws InvalidBlockIdsException {
      return planner.plan(req.geometry, req.geometry.numBlocks(), req.local, req.remote);
    }

    void rounds(int rounds) throws InvalidBlockIdsException {
      long s = 0;
      for (int r = 0; r < rounds; r++) {
        long start = System.nanoTime();
        for (int i = 0; i < callsPerRound; i++) {
          s += planOnce().count();
        }
        secondsPerCall.add((System.nanoTime() - start) / 1e9 / callsPerRound);
      }
      sink = s;
    }

    double medianSecondsPerCall() {
      return Samples.median(secondsPerCall);
    }
  }

  private record SeedResult(double secondsPerCall, TransferBatch plan) {}

  private static SeedResult seed(String python, java.nio.file.Path script, Request req) throws IOException {
    StringBuilder in = new StringBuilder();
    in.append("{\"layout\": \"standard\", \"num_blocks\": ").append(req.geometry.numBlocks())
        .append(", \"remote_num_blocks\": ").append(req.geometry.numBlocks())
        .append(", \"block_size\": ").append(Geometry.BLOCK_TOKENS)
        .append(", \"kv_heads\": ").append(Geometry.KV_HEADS)
        .append(", \"head_dim\": ").append(Geometry.HEAD_DIM)
        .append(", \"elem_size\": ").append(Geometry.ELEMENT_BYTES)
        .append(", \"local_block_ids\": ").append(Arrays.toString(req.local))
        .append(", \"remote_block_ids\": ").append(Arrays.toString(req.remote)).append('}');
    // About 0.3 s of calls per round for the seed, which takes some 5 us per block.
    int calls = Math.max(3, 60_000 / req.local.length);
    PeerTools.Output o = PeerTools.run(
        List.of(python, script.toString(), "--bench",
            String.valueOf(calls)),
        in.toString().getBytes(StandardCharsets.UTF_8), Duration.ofMinutes(5));
    if (o.exitCode() != 0) {
      throw new IOException("exit " + o.exitCode() + ": " + o.stderr().strip());
    }
    JsonNode j = new ObjectMapper().readTree(o.lastLine());
    TransferBatch plan = new TransferBatch(longs(j.get("local_offsets")),
        longs(j.get("remote_offsets")), longs(j.get("sizes")));
    return new SeedResult(j.get("seconds_per_call").asDouble(), plan);
  }

  private static long[] longs(JsonNode array) {
    long[] out = new long[array.size()];
    for (int i = 0; i < out.length; i++) {
      out[i] = array.get(i).asLong();
    }
    return out;
  }
}
