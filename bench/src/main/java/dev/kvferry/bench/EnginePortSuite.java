package dev.kvferry.bench;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import dev.kvferry.demo.ChildProcess;
import dev.kvferry.demo.PythonEngineDemo;
import java.io.IOException;
import java.io.PrintStream;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Locale;
import java.util.Optional;
import org.jspecify.annotations.Nullable;

/**
 * The engine port's cost (issue 16): a node JVM with {@code --engine port} and the Python client
 * {@code kvferry.bench_port} timing, on the same socket, a ping, one scheduler call, and the
 * port's time in one engine step at 256 requests per step (K of them new and finishing). The
 * goal rows hold that time against 5% of a 10 ms step: the peer column is that budget. The
 * requests carry no kv_transfer_params: the client answers them itself (its default); one more
 * row, without a goal, has it tell the node of them ({@code send_plain}), so the node's side of
 * each request is timed too.
 */
public final class EnginePortSuite {

  /** DESIGN/issue 16: the port takes under 5% of a 10 ms engine step. */
  static final double BUDGET_US = 500.0;

  private static final int[] NEW_PER_STEP = {0, 16, 256};

  private final Path python;
  private final PrintStream progress;
  private final int steps;
  private final int roundTrips;

  /** The published sizes: 200 steps and 2,000 round trips per figure. */
  public EnginePortSuite(Path python, PrintStream progress) {
    this(python, progress, 200, 2000);
  }

  public EnginePortSuite(Path python, PrintStream progress, int steps, int roundTrips) {
    this.python = python;
    this.progress = progress;
    this.steps = steps;
    this.roundTrips = roundTrips;
  }

  public List<BenchRow> run() {
    Optional<Path> pkg = PythonEngineDemo.locatePackage();
    if (pkg.isEmpty()) {
      return List.of(missing("the kvferry Python package (python/) was not found; set"
          + " KVFERRY_PYTHON_PATH"));
    }
    Path work;
    try {
      work = Files.createTempDirectory("kvferry-bench-port-");
    } catch (IOException e) {
      return List.of(missing("no temp dir: " + e.getMessage()));
    }
    Path socket = work.resolve("port.sock");
    try (ChildProcess node = ChildProcess.start("port-node", work, List.of("-Xmx384m"), List.of(
        "node", "--role", "prefill", "--engine-id", "bench-port", "--engine", "port",
        "--engine-socket", socket.toString(), "--port",
        Integer.toString(dev.kvferry.node.FreePorts.next()), "--management-port",
        Integer.toString(dev.kvferry.node.FreePorts.next())))) {
      long deadline = System.nanoTime() + Duration.ofSeconds(90).toNanos();
      while (!Files.exists(socket)) {
        if (!node.isAlive() || System.nanoTime() > deadline) {
          return List.of(missing("the node did not open its socket; see " + node.log()));
        }
        Thread.sleep(100);
      }
      List<BenchRow> rows = new ArrayList<>();
      for (int fresh : NEW_PER_STEP) {
        progress.printf("  engine port, 256 requests per step, %d new%n", fresh);
        JsonNode j = measure(pkg.get(), socket, fresh, false);
        if (fresh == 0) {
          rows.add(BenchRow.figure("engine port round trip p50 (ping)", "us",
              j.get("ping_p50_us").asDouble(), String.format(Locale.ROOT,
                  "Python client, Unix socket, msgpack; p99 %.1f us",
                  j.get("ping_p99_us").asDouble())));
          rows.add(BenchRow.figure("engine port scheduler call p50", "us",
              j.get("scheduler_call_p50_us").asDouble(), String.format(Locale.ROOT,
                  "get_num_new_matched_tokens; p99 %.1f us",
                  j.get("scheduler_call_p99_us").asDouble())));
        }
        rows.add(stepRow("engine port time in a step, 256 req, " + fresh + " new", j, 1.0));
      }
      progress.println("  engine port, 256 requests per step, 256 new, the node told of them");
      rows.add(stepRow("engine port time in a step, 256 req, 256 new, node told", measure(
          pkg.get(), socket, 256, true), null));
      return rows;
    } catch (IOException | RuntimeException e) {
      return List.of(missing("engine port bench failed: " + e));
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      return List.of(missing("interrupted"));
    }
  }

  /** {@code sendPlain}: the client tells the node of the requests (they carry no params). */
  private JsonNode measure(Path pkg, Path socket, int fresh, boolean sendPlain)
      throws IOException, InterruptedException {
    List<String> command = new ArrayList<>(List.of(python.toString(), "-m", "kvferry.bench_port",
        "--socket", socket.toString(), "--requests", "256", "--new", Integer.toString(fresh),
        "--steps", Integer.toString(steps), "--round-trips", Integer.toString(roundTrips)));
    if (sendPlain) {
      command.add("--send-plain");
    }
    ProcessBuilder b = new ProcessBuilder(command);
    b.environment().put("PYTHONPATH", pkg.toString());
    b.environment().put("PYTHONDONTWRITEBYTECODE", "1");
    b.redirectErrorStream(true);
    Process p = b.start();
    String out = new String(p.getInputStream().readAllBytes(), java.nio.charset.StandardCharsets.UTF_8);
    if (p.waitFor() != 0) {
      throw new IOException("kvferry.bench_port exit " + p.exitValue() + ": " + out.strip());
    }
    String[] lines = out.strip().split("\n");
    return new ObjectMapper().readTree(lines[lines.length - 1]);
  }

  private static BenchRow stepRow(String name, JsonNode j, @Nullable Double goal) {
    return BenchRow.lowerIsBetter(name, "us", j.get("step_port_p50_us").asDouble(), BUDGET_US,
        goal, String.format(Locale.ROOT,
            "peer = 5%% of a 10 ms step; %.1f%% of it at p50, p99 %.0f us%s",
            100 * j.get("share_of_10ms_step_p50").asDouble(), j.get("step_port_p99_us").asDouble(),
            j.path("finished_ahead").asBoolean(false)
                ? "; a prefill worker: get_finished asked a step ahead" : ""));
  }

  private static BenchRow missing(String why) {
    return new BenchRow("engine port time in a step, 256 req", "us", null, BUDGET_US, null, 1.0,
        false, why);
  }
}
