package dev.kvferry.cli;

import dev.kvferry.actors.plan.InvalidBlockIdsException;
import dev.kvferry.actors.plan.TransferPlanner;
import dev.kvferry.rdma.TransferBatch;
import java.io.IOException;
import java.io.InputStream;
import java.io.PrintWriter;
import java.util.Arrays;
import java.util.concurrent.Callable;
import java.util.function.Supplier;
import org.jspecify.annotations.Nullable;
import picocli.CommandLine.Command;
import picocli.CommandLine.Model.CommandSpec;
import picocli.CommandLine.Option;
import picocli.CommandLine.Spec;

/**
 * {@code kvferry plan}: the transfer planner on one request, with the same input and output as the
 * seed's planner script, so the two can be compared and timed side by side.
 */
@Command(
    name = "plan",
    mixinStandardHelpOptions = true,
    description = {
      "Plans the copies that move one request's KV cache, like the seed's planner script.",
      "Reads one JSON object on stdin: layout (standard|blocks_first|mla), num_blocks, remote_num_blocks"
          + " (default: num_blocks), block_size, kv_heads, head_dim, latent, elem_size,"
          + " local_block_ids, remote_block_ids.",
      "Prints one JSON line: {\"local_offsets\": [...], \"remote_offsets\": [...], \"sizes\":"
          + " [...]}. Invalid input: exit code 2 and one line on stderr."
    })
public final class PlanCommand implements Callable<Integer> {

  static final int EXIT_INVALID_INPUT = 2;
  private static final int BENCH_ROUNDS = 5;

  /** Where the bench leaves a sum of its results, so the JIT cannot drop the timed calls. */
  @SuppressWarnings("unused")
  private static volatile long benchSink;

  @Spec CommandSpec spec;

  @Option(
      names = "--bench",
      paramLabel = "K",
      description =
          "Also time K calls of the planner, median of 5 rounds after a warm-up, and add"
              + " \"seconds_per_call\".")
  @Nullable Integer benchCalls;

  @Option(
      names = "--warmup-ms",
      paramLabel = "MS",
      defaultValue = "2000",
      description = "With --bench: keep planning this long before timing, so the JIT has compiled"
          + " the planner (default: ${DEFAULT-VALUE}).")
  long warmupMs;

  private final Supplier<InputStream> stdin;

  /** Reads the request from {@link System#in}. */
  public PlanCommand() {
    this(() -> System.in);
  }

  PlanCommand(Supplier<InputStream> stdin) {
    this.stdin = stdin;
  }

  @Override
  public Integer call() {
    PrintWriter out = spec.commandLine().getOut();
    PrintWriter err = spec.commandLine().getErr();
    if (benchCalls != null && benchCalls < 1) {
      return invalid(err, "--bench must be at least 1, got " + benchCalls);
    }
    if (warmupMs < 0) {
      return invalid(err, "--warmup-ms must not be negative, got " + warmupMs);
    }
    PlanInput input;
    try {
      input = PlanInput.parse(readStdin());
    } catch (PlanInput.InvalidPlanInputException e) {
      return invalid(err, e.getMessage());
    }
    TransferPlanner planner = new TransferPlanner();
    TransferBatch batch;
    double secondsPerCall = 0;
    try {
      batch = plan(planner, input);
      if (benchCalls != null) {
        secondsPerCall = secondsPerCall(planner, input, benchCalls, warmupMs * 1_000_000L);
      }
    } catch (InvalidBlockIdsException e) {
      return invalid(err, e.getMessage());
    }
    StringBuilder json = new StringBuilder(32 + batch.count() * 40);
    json.append("{\"local_offsets\": ");
    appendArray(json, batch.localOffsets());
    json.append(", \"remote_offsets\": ");
    appendArray(json, batch.remoteOffsets());
    json.append(", \"sizes\": ");
    appendArray(json, batch.sizes());
    if (benchCalls != null) {
      json.append(", \"seconds_per_call\": ").append(secondsPerCall);
    }
    json.append('}');
    out.println(json);
    out.flush();
    return 0;
  }

  private byte[] readStdin() throws PlanInput.InvalidPlanInputException {
    try {
      return stdin.get().readAllBytes();
    } catch (IOException e) {
      throw new PlanInput.InvalidPlanInputException("cannot read stdin: " + e.getMessage());
    }
  }

  private static TransferBatch plan(TransferPlanner planner, PlanInput input)
      throws InvalidBlockIdsException {
    return planner.plan(
        input.geometry(), input.remoteNumBlocks(), input.localBlockIds(), input.remoteBlockIds());
  }

  /** Like the seed script's --bench: median of 5 rounds of {@code calls} calls, after a warm-up. */
  private static double secondsPerCall(
      TransferPlanner planner, PlanInput input, int calls, long warmupNs)
      throws InvalidBlockIdsException {
    long sink = 0;
    long warmupEnd = System.nanoTime() + warmupNs;
    do {
      for (int i = 0; i < calls; i++) {
        sink += plan(planner, input).count();
      }
    } while (System.nanoTime() < warmupEnd);
    double[] rounds = new double[BENCH_ROUNDS];
    for (int r = 0; r < BENCH_ROUNDS; r++) {
      long start = System.nanoTime();
      for (int i = 0; i < calls; i++) {
        sink += plan(planner, input).count();
      }
      rounds[r] = (System.nanoTime() - start) / 1e9 / calls;
    }
    benchSink = sink;
    Arrays.sort(rounds);
    return rounds[BENCH_ROUNDS / 2];
  }

  /** Python json.dump's separators, so the output matches the seed script's byte for byte. */
  private static void appendArray(StringBuilder json, long[] values) {
    json.append('[');
    for (int i = 0; i < values.length; i++) {
      if (i > 0) {
        json.append(", ");
      }
      json.append(values[i]);
    }
    json.append(']');
  }

  private static int invalid(PrintWriter err, @Nullable String message) {
    err.println("kvferry plan: " + message);
    err.flush();
    return EXIT_INVALID_INPUT;
  }
}
