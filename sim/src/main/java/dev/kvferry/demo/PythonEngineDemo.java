package dev.kvferry.demo;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import dev.kvferry.node.FreePorts;
import java.io.IOException;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.concurrent.TimeUnit;
import org.jspecify.annotations.Nullable;

/**
 * {@code kvferry demo --engine python}: a router, a P node and a D node (JVMs), each node beside a
 * reference engine in its own Python process driving it through the engine port, and a third
 * reference engine without kvferry as the baseline. Per mode, kvferry.demo sends the workload to
 * the router's OpenAI-compatible endpoint as a client would (some clients hang up mid-stream) and
 * compares D's tokens with the baseline's.
 */
public final class PythonEngineDemo implements AutoCloseable {

  private static final Duration READY_TIMEOUT = Duration.ofSeconds(90);
  private static final ObjectMapper JSON = new ObjectMapper();

  /** One mode's result: the Java demo's fields where the driver reports them, and the tokens. */
  public record Report(String mode, JsonNode driver) {
    boolean passed() {
      return driver.path("tokens_match").asBoolean(false)
          && driver.path("kv_verified").asBoolean(false)
          && driver.path("completed").asInt(0) > 0
          && driver.path("failed").asInt(0) == 0
          && leaked() == 0;
    }

    int leaked() {
      JsonNode l = driver.path("leaked_blocks");
      if (l.isInt()) {
        return l.asInt();
      }
      int sum = 0;
      for (JsonNode v : l) {
        sum += v.asInt();
      }
      return sum;
    }
  }

  private final Path python;
  private final Path pythonPath;
  private final Path logDir;
  private final int tpP;
  private final int tpD;
  private final List<ChildProcess> nodes = new ArrayList<>();
  /** The nodes' management ports: their metrics say how many KV bytes they moved. */
  private final List<Integer> managementPorts = new ArrayList<>();
  private final List<Process> engines = new ArrayList<>();

  public PythonEngineDemo(Path python, Path pythonPath, int tpP, int tpD) throws IOException {
    this.python = python;
    this.pythonPath = pythonPath;
    this.tpP = tpP;
    this.tpD = tpD;
    this.logDir = Files.createTempDirectory("kvferry-demo-python-");
  }

  /** The folder holding the {@code kvferry} package: KVFERRY_PYTHON_PATH, else next to the jar. */
  public static Optional<Path> locatePackage() {
    String env = System.getenv("KVFERRY_PYTHON_PATH");
    List<Path> candidates = new ArrayList<>();
    if (env != null && !env.isBlank()) {
      candidates.add(Path.of(env));
    }
    try {
      Path code = Path.of(PythonEngineDemo.class.getProtectionDomain().getCodeSource()
          .getLocation().toURI());
      // cli/target/kvferry.jar or sim/target/classes: the checkout is three names up.
      Path checkout = code.toAbsolutePath().normalize();
      for (int i = 0; i < 3 && checkout != null; i++) {
        checkout = checkout.getParent();
      }
      if (checkout != null) {
        candidates.add(checkout.resolve("python"));
      }
    } catch (Exception e) {
      // no code source: only the environment can say
    }
    candidates.add(Path.of("python").toAbsolutePath());
    return candidates.stream()
        .filter(p -> Files.isRegularFile(p.resolve("kvferry").resolve("__init__.py")))
        .findFirst();
  }

  public Path logDir() {
    return logDir;
  }

  /** Starts the cluster, then runs each mode with fresh engines; returns a report per mode. */
  public List<Report> run(List<String> modes, PrintStream out) throws Exception {
    int routerPort = FreePorts.next();
    int httpPort = FreePorts.next();
    String seed = "127.0.0.1:" + routerPort;
    String router = "http://127.0.0.1:" + httpPort;
    // The router is the proxy the driver sends every request to, as a client would.
    nodes.add(ChildProcess.start("router", logDir, List.of("-Xmx256m"), List.of("router",
        "--port", Integer.toString(routerPort),
        "--management-port", Integer.toString(FreePorts.next()), "--seed-nodes", seed,
        "--http-port", Integer.toString(httpPort))));
    String modeList = String.join(",", modes);
    Path pSocket = logDir.resolve("prefill.sock");
    Path dSocket = logDir.resolve("decode.sock");
    nodes.add(node("prefill", pSocket, modeList, tpP, seed));
    nodes.add(node("decode", dSocket, modeList, tpD, seed));
    List<Report> reports = new ArrayList<>();
    for (String mode : modes) {
      out.println("mode " + mode + ": starting reference engines (P TP " + tpP + ", D TP " + tpD
          + ", baseline without kvferry)");
      String p = engine("prefill-" + mode, "prefill", mode, pSocket, tpP);
      String d = engine("decode-" + mode, "decode", mode, dSocket, tpD);
      String baseline = engine("baseline-" + mode, "decode", mode, null, 1);
      awaitRoutable(router);
      long bytesBefore = movedBytes();
      List<String> cmd = List.of(python.toString(), "-m", "kvferry.demo", "--prefill", p,
          "--decode", d, "--baseline", baseline, "--router", router, "--mode", mode, "--json");
      Process driver = pythonProcess(cmd, logDir.resolve("driver-" + mode + ".log"));
      if (!driver.waitFor(10, TimeUnit.MINUTES)) {
        driver.destroyForcibly();
        throw new IllegalStateException("kvferry.demo (" + mode + ") ran over 10 minutes; see "
            + logDir);
      }
      List<String> lines = Files.readAllLines(logDir.resolve("driver-" + mode + ".log"));
      lines.stream().filter(l -> !l.startsWith("{")).forEach(l -> out.println("  " + l));
      String last = lines.stream().filter(l -> l.startsWith("{")).reduce((a, b) -> b)
          .orElseThrow(() -> new IllegalStateException("kvferry.demo (" + mode
              + ") printed no JSON (exit " + driver.exitValue() + "); see " + logDir));
      com.fasterxml.jackson.databind.node.ObjectNode driven =
          (com.fasterxml.jackson.databind.node.ObjectNode) JSON.readTree(last);
      long bytesAfter = movedBytes();
      if (bytesBefore >= 0 && bytesAfter >= 0) {
        driven.put("bytes", bytesAfter - bytesBefore); // KV the nodes moved this mode
      }
      reports.add(new Report(mode, driven));
      stopEngines();
    }
    return reports;
  }

  private ChildProcess node(String role, Path socket, String modes, int tp, String seed)
      throws IOException {
    int management = FreePorts.next();
    managementPorts.add(management);
    List<String> jvmArgs = new java.util.ArrayList<>(List.of("-Xmx512m", "-XX:+UseSerialGC"));
    jvmArgs.addAll(Demo.inheritedProperties());
    return ChildProcess.start(role, logDir, jvmArgs, List.of(
        "node", "--role", role, "--engine-id", role + "-0", "--mode", modes,
        "--engine", "port", "--engine-socket", socket.toString(), "--tp-size",
        Integer.toString(tp), "--port", Integer.toString(FreePorts.next()),
        "--management-port", Integer.toString(management), "--seed-nodes", seed));
  }

  /**
   * KV bytes the nodes' workers moved so far (the sum of their kvferry_transfer_bytes_total: the
   * side that copies counts, P's writer in WRITE mode, D's reader in READ), or -1 if unknown.
   */
  private long movedBytes() {
    long sum = 0;
    for (int port : managementPorts) {
      try {
        sum += NodeMetricsText.read(java.net.URI.create("http://127.0.0.1:" + port + "/metrics"))
            .getOrDefault("kvferry_transfer_bytes_total", 0.0).longValue();
      } catch (IOException e) {
        return -1;
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
        return -1;
      }
    }
    return sum;
  }

  /**
   * Waits until the router routes (it learns the engines, and their URLs, from cluster
   * membership): a one-token completion answers 200.
   */
  private void awaitRoutable(String router) throws Exception {
    java.net.http.HttpClient client = java.net.http.HttpClient.newHttpClient();
    java.net.http.HttpRequest probe = java.net.http.HttpRequest.newBuilder(
            java.net.URI.create(router + "/v1/completions"))
        .timeout(Duration.ofSeconds(30))
        .header("Content-Type", "application/json")
        .POST(java.net.http.HttpRequest.BodyPublishers.ofString(
            "{\"prompt\": [1, 2, 3], \"max_tokens\": 1}"))
        .build();
    long deadline = System.nanoTime() + READY_TIMEOUT.toNanos();
    String last = "no answer";
    while (System.nanoTime() < deadline) {
      try {
        java.net.http.HttpResponse<String> r =
            client.send(probe, java.net.http.HttpResponse.BodyHandlers.ofString());
        if (r.statusCode() == 200) {
          return;
        }
        last = r.statusCode() + " " + r.body();
      } catch (IOException e) {
        last = e.toString();
      }
      Thread.sleep(300);
    }
    throw new IllegalStateException("the router at " + router + " never routed: " + last
        + "; see " + logDir);
  }

  /** Starts a reference engine; returns its HTTP base URL once it says it is ready. */
  private String engine(String name, String role, String mode, @Nullable Path socket, int tp)
      throws Exception {
    List<String> cmd = new ArrayList<>(List.of(python.toString(), "-m", "kvferry.reference",
        "--http-port", "0", "--role", role, "--mode", mode, "--tp-size", Integer.toString(tp)));
    if (socket != null) {
      cmd.addAll(List.of("--socket", socket.toString()));
    } else {
      cmd.add("--no-connector");
    }
    Path log = logDir.resolve(name + ".log");
    Process p = pythonProcess(cmd, log);
    engines.add(p);
    long deadline = System.nanoTime() + READY_TIMEOUT.toNanos();
    while (System.nanoTime() < deadline) {
      for (String line : Files.readAllLines(log, StandardCharsets.UTF_8)) {
        int at = line.indexOf("kvferry-reference ready ");
        if (at >= 0) {
          return line.substring(at + "kvferry-reference ready ".length()).trim();
        }
      }
      if (!p.isAlive()) {
        throw new IllegalStateException("reference engine " + name + " exited with "
            + p.exitValue() + "; see " + log);
      }
      for (ChildProcess n : nodes) {
        if (!n.isAlive()) {
          throw new IllegalStateException(n.exitDescription() + "; see " + n.log());
        }
      }
      Thread.sleep(100);
    }
    throw new IllegalStateException("reference engine " + name + " not ready within "
        + READY_TIMEOUT + "; see " + log);
  }

  private Process pythonProcess(List<String> cmd, Path log) throws IOException {
    ProcessBuilder b = new ProcessBuilder(cmd).redirectErrorStream(true)
        .redirectOutput(log.toFile());
    Map<String, String> env = b.environment();
    String old = env.get("PYTHONPATH");
    env.put("PYTHONPATH", pythonPath + (old == null || old.isBlank() ? "" : ":" + old));
    env.put("PYTHONDONTWRITEBYTECODE", "1");
    return b.start();
  }

  private void stopEngines() throws InterruptedException {
    for (Process p : engines) {
      p.destroy();
    }
    for (Process p : engines) {
      if (!p.waitFor(10, TimeUnit.SECONDS)) {
        p.destroyForcibly().waitFor();
      }
    }
    engines.clear();
  }

  /** The demo's table, one row per mode. */
  public static void printTable(List<Report> reports, PrintStream out) {
    out.printf("%n%-6s %9s %9s %7s %6s %12s %13s %11s %7s%n", "mode", "requests", "completed",
        "aborted", "failed", "KV bytes", "tokens match", "kv verified", "leaked");
    for (Report r : reports) {
      JsonNode d = r.driver();
      out.printf("%-6s %9d %9d %7d %6d %12d %13s %11s %7d%n", r.mode(), d.path("requests").asInt(),
          d.path("completed").asInt(), d.path("aborted").asInt(), d.path("failed").asInt(),
          d.path("bytes").asLong(), d.path("tokens_match").asBoolean(),
          d.path("kv_verified").asBoolean(), r.leaked());
    }
  }

  /** The demo's JSON: the Java demo's per-mode fields with tokens_match beside them. */
  public static String toJson(List<Report> reports) throws IOException {
    Map<String, Object> modes = new LinkedHashMap<>();
    for (Report r : reports) {
      JsonNode d = r.driver();
      Map<String, Object> m = new LinkedHashMap<>();
      m.put("requests", d.path("requests").asInt());
      m.put("completed", d.path("completed").asInt());
      m.put("aborted", d.path("aborted").asInt());
      m.put("failed", d.path("failed").asInt());
      m.put("bytes", d.path("bytes").asLong());
      m.put("mismatches", d.path("mismatches").asInt(d.path("kv_verified").asBoolean() ? 0 : 1));
      m.put("leaked_blocks", r.leaked());
      m.put("tokens_match", d.path("tokens_match").asBoolean());
      m.put("kv_verified", d.path("kv_verified").asBoolean());
      modes.put(r.mode(), m);
    }
    return JSON.writeValueAsString(Map.of("modes", modes));
  }

  /** Whether every mode passed. */
  public static boolean passed(List<Report> reports) {
    return !reports.isEmpty() && reports.stream().allMatch(Report::passed);
  }

  @Override
  public void close() {
    try {
      stopEngines();
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      engines.forEach(Process::destroyForcibly);
    }
    nodes.parallelStream().forEach(ChildProcess::close);
    nodes.clear();
  }
}
