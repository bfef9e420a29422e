package dev.kvferry.demo;

import dev.kvferry.engine.EngineService;
import com.typesafe.config.Config;
import dev.kvferry.actors.connector.Role;
import dev.kvferry.actors.connector.TransferMode;
import dev.kvferry.actors.engine.EngineIdentity;
import dev.kvferry.node.FreePorts;
import dev.kvferry.node.PekkoFutures;
import dev.kvferry.node.KvferryConfig;
import dev.kvferry.router.RouterActor;
import dev.kvferry.engine.RequestSpec;
import dev.kvferry.engine.EngineService.Outcome;
import java.io.IOException;
import java.io.PrintStream;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Map;
import java.util.Random;
import java.util.Set;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionStage;
import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.Semaphore;
import java.util.concurrent.TimeUnit;
import java.util.stream.Collectors;
import me.tongfei.progressbar.ProgressBar;
import me.tongfei.progressbar.ProgressBarBuilder;
import me.tongfei.progressbar.ProgressBarStyle;
import org.apache.pekko.actor.typed.ActorRef;
import org.apache.pekko.actor.typed.ActorSystem;
import org.apache.pekko.actor.typed.javadsl.AskPattern;
import org.apache.pekko.actor.typed.javadsl.Behaviors;
import org.apache.pekko.actor.typed.receptionist.Receptionist;
import org.apache.pekko.actor.typed.receptionist.ServiceKey;
import org.jspecify.annotations.Nullable;

/**
 * The demo: a router, a prefill node and a decode node as separate JVMs in a cluster on loopback,
 * the simulated workload run through them in each mode, every byte verified on D, block counts
 * checked on both sides at the end. This process joins the cluster as a client.
 */
public final class Demo implements AutoCloseable {

  private static final Duration JOIN_TIMEOUT = Duration.ofSeconds(90);
  /**
   * Four JVMs share the host's cores with the workload: be patient with heartbeats so a busy
   * moment is not mistaken for a dead node.
   */
  private static final List<String> CHILD_JVM_ARGS = List.of("-Xmx512m", "-XX:+UseSerialGC");
  private static final Map<String, String> PATIENT_CLUSTER = Map.of(
      "pekko.cluster.failure-detector.acceptable-heartbeat-pause", "20s",
      // Pekko gives its logger 5 s to start; a JVM starting beside three others on a busy
      // two-core host has been seen to miss that and exit.
      "pekko.logger-startup-timeout", "30s");

  private final DemoOptions options;
  private final Path logDir;
  private final int routerPort;
  private final Map<String, String> clusterSettings;
  private final List<ChildProcess> children = new ArrayList<>();
  private final Map<String, Integer> managementPorts = new java.util.HashMap<>();
  /** Where each process's management HTTP listens (its placement's host). */
  private final Map<String, String> managementHosts = new java.util.HashMap<>();
  /** The router's and this client's cluster address; nodes elsewhere must reach it. */
  private final String clusterHost;
  /** Where the router and nodes without a placement of their own run: directly, on clusterHost. */
  private final NodePlacement here;
  // Set by start(), before anything reads them.
  @SuppressWarnings("NullAway.Init")
  private ActorSystem<Void> client;

  @SuppressWarnings("NullAway.Init")
  private ActorRef<RouterActor.Command> routerRef;

  public Demo(DemoOptions options) throws IOException {
    this(options, Map.of());
  }

  /**
   * A demo whose processes all run with {@code clusterSettings} (config paths, as {@code -D} flags
   * in the child JVMs and as config in this process) over the demo's patient failure detector.
   * Fault tests pass a short failure detector and long connector timeouts here.
   */
  public Demo(DemoOptions options, Map<String, String> clusterSettings)
      throws IOException {
    this(options, clusterSettings, NodePlacement.LOOPBACK.host());
  }

  /**
   * As {@link #Demo(DemoOptions, Map)}, with the router and this client bound to {@code
   * clusterHost} instead of loopback, so nodes placed in other network namespaces can reach them.
   */
  public Demo(DemoOptions options, Map<String, String> clusterSettings, String clusterHost)
      throws IOException {
    this.options = options;
    this.clusterHost = clusterHost;
    this.here = NodePlacement.LOOPBACK.withHost(clusterHost);
    this.logDir = Files.createTempDirectory("kvferry-demo-");
    this.routerPort = FreePorts.next();
    Map<String, String> merged = new java.util.TreeMap<>(PATIENT_CLUSTER);
    merged.putAll(clusterSettings);
    this.clusterSettings = Map.copyOf(merged);
  }

  /** Heap the demo's JVMs may take besides the KV caches: 3 children at -Xmx512m and this one. */
  static final long JVM_BYTES = 4L * 512 * 1024 * 1024;

  /**
   * Why the demo would not fit in {@code availableBytes} of host memory, or empty: its KV caches
   * (both nodes, every mode) and its JVMs must fit, or the kernel's OOM killer ends a node midway
   * and no result is printed.
   */
  public static java.util.Optional<String> memoryRefusal(DemoOptions o, long availableBytes) {
    long p = o.hostKvCacheBytes(true);
    long d = o.hostKvCacheBytes(false);
    long need = p + d + JVM_BYTES;
    if (p + d == 0 || need <= availableBytes) {
      return java.util.Optional.empty();
    }
    return java.util.Optional.of(String.format(java.util.Locale.ROOT,
        "the KV caches need %s of host memory (prefill %s: %d blocks; decode %s: %d blocks; %d"
            + " layers, %d mode(s)) and the JVMs about %s, %s in all, but only %s is available"
            + " (MemAvailable): lower --num-blocks-p/--num-blocks-d or --layers, or run one mode",
        human(p + d), human(p), o.numBlocksP(), human(d), o.numBlocksD(), o.layers(),
        o.modes().size(), human(JVM_BYTES), human(need), human(availableBytes)));
  }

  /** This host's MemAvailable from /proc/meminfo, or -1 where it cannot be read. */
  public static long availableMemoryBytes() {
    try {
      for (String line : Files.readAllLines(Path.of("/proc/meminfo"))) {
        if (line.startsWith("MemAvailable:")) {
          String[] f = line.trim().split("\\s+");
          return Long.parseLong(f[1]) * 1024; // kB
        }
      }
    } catch (IOException | RuntimeException e) {
      // not Linux: the check is skipped
    }
    return -1;
  }

  public Path logDir() {
    return logDir;
  }

  /** Runs every requested mode; one report per mode. */
  public List<ModeReport> run() throws Exception {
    startCluster();
    List<ModeReport> reports = new ArrayList<>();
    for (String mode : options.modes()) {
      ActorRef<EngineService.Command> pSim = awaitSim(Role.PREFILL, engineId("prefill", mode));
      ActorRef<EngineService.Command> dSim = awaitSim(Role.DECODE, engineId("decode", mode));
      awaitRoutable(engineId("prefill", mode), engineId("decode", mode));
      reports.add(runWorkload(mode, routerRef, pSim, dSim));
    }
    return reports;
  }

  // ---- hooks for tests that drive the demo's cluster themselves ----

  /**
   * Starts the demo's cluster without running a workload: the router, a node "prefill" and a node
   * "decode" (one engine per mode each), and this process as a client member; returns once the
   * router is listed.
   */
  public void startCluster() throws Exception {
    startCluster(here, here);
  }

  /** As {@link #startCluster()}, with the two engine nodes started in the given placements. */
  public void startCluster(NodePlacement prefill, NodePlacement decode) throws Exception {
    String seed = seed();
    ChildProcess router =
        start("router", here,
            List.of("router", "--host", clusterHost, "--port", Integer.toString(routerPort),
            "--management-port", Integer.toString(managementPort("router")), "--seed-nodes", seed));
    // One P and one D node, each hosting one engine per mode: JVM start-up dominates a short run.
    startNode("prefill", Role.PREFILL, 0, 1, prefill);
    startNode("decode", Role.DECODE, 0, 1, decode);
    // The client joins through the router: start it once the router listens.
    router.awaitLog("kvferry router up", JOIN_TIMEOUT);
    client = startClient(seed);
    routerRef = awaitOne(RouterActor.SERVICE_KEY, ref -> true, "the router", router);
  }

  /**
   * Starts one more engine node (a JVM named {@code name}, its node id {@code name}) with the
   * demo's geometry, transport and modes; its engines are {@link #engineId}{@code (name, mode)}.
   */
  public ChildProcess startNode(String name, Role role) throws IOException {
    return startNode(name, role, 0, 1);
  }

  /** As {@link #startNode(String, Role)}, as DP rank {@code dpRank} of {@code dpSize}. */
  public ChildProcess startNode(String name, Role role, int dpRank, int dpSize) throws IOException {
    return startNode(name, role, dpRank, dpSize, here);
  }

  /**
   * As {@link #startNode(String, Role, int, int)}, run through {@code placement}'s command prefix
   * (a network namespace, say) with its cluster, data-plane and management sockets on its host.
   */
  public ChildProcess startNode(String name, Role role, int dpRank, int dpSize,
      NodePlacement placement) throws IOException {
    boolean prefill = role == Role.PREFILL;
    List<String> args = nodeArgs(role.clusterRole(), name, String.join(",", options.modes()), seed(),
        prefill ? options.numBlocksP() : options.numBlocksD(),
        prefill ? options.tpP() : options.tpD(),
        prefill ? options.blockSizeP() : options.blockSizeD(),
        managementPort(name));
    args.addAll(options.kvCacheFlags(prefill));
    args.addAll(List.of("--dp-rank", Integer.toString(dpRank), "--dp-size", Integer.toString(dpSize),
        "--host", placement.host(), "--management-host", placement.host()));
    managementHosts.put(name, placement.host());
    return start(name, placement, args);
  }

  /** The engine id node {@code node} gives its engine of {@code mode}. */
  public String engineId(String node, String mode) {
    return options.modes().size() > 1 ? node + "-" + mode : node;
  }

  /** The child process started last under {@code name} (a restarted node's newest JVM). */
  public ChildProcess process(String name) {
    ChildProcess found = null;
    for (ChildProcess c : children) {
      if (c.name().equals(name)) {
        found = c;
      }
    }
    if (found == null) {
      throw new IllegalArgumentException("no process named " + name);
    }
    return found;
  }

  /** Where process {@code name} serves Pekko Management and kvferry's routes. */
  public java.net.URI managementUri(String name) {
    Integer port = managementPorts.get(name);
    if (port == null) {
      throw new IllegalArgumentException("no process named " + name);
    }
    String host = managementHosts.getOrDefault(name, NodePlacement.LOOPBACK.host());
    return java.net.URI.create("http://" + host + ":" + port + "/");
  }

  /**
   * What the decode node's metrics say of its receives: how many ended received, and how many of
   * those P's done words reported ahead of WriteDone (WRITE only; READ receives never are); empty
   * when its metrics cannot be read.
   */
  public java.util.Optional<String> doneWordsLine() {
    try {
      Map<String, Double> m = NodeMetricsText.read(managementUri("decode").resolve("metrics"));
      Double received = m.get("kvferry_transfers_total{outcome=\"received\"}");
      Double byWord = m.get("kvferry_receives_done_by_word_total");
      if (received == null || byWord == null) {
        return java.util.Optional.empty();
      }
      return java.util.Optional.of(String.format(java.util.Locale.ROOT,
          "decode node: %.0f receives, %.0f of them reported done by P's done words (WRITE only)",
          received, byWord));
    } catch (IOException | RuntimeException e) {
      return java.util.Optional.empty();
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      return java.util.Optional.empty();
    }
  }

  /** This process's actor system, a member of the demo's cluster with role "client". */
  public ActorSystem<Void> client() {
    return client;
  }

  public ActorRef<RouterActor.Command> router() {
    return routerRef;
  }

  /** Waits until the simulated engine {@code engineId} of {@code role} is listed. */
  public ActorRef<EngineService.Command> awaitSim(Role role, String engineId) throws Exception {
    return awaitOne(EngineService.serviceKey(role),
        r -> EngineIdentity.fromActorName(r.path().name())
            .map(id -> id.engineId().equals(engineId)).orElse(false),
        engineId, null);
  }

  /**
   * Waits until the router itself routes to these engines: it learns of them from its own
   * Receptionist subscription, which can lag this process's view by a moment.
   */
  public void awaitRoutable(String prefillEngineId, String decodeEngineId) throws Exception {
    long deadline = System.nanoTime() + JOIN_TIMEOUT.toNanos();
    RouterActor.Routable r = null;
    while (System.nanoTime() < deadline) {
      r = AskPattern.ask(routerRef, RouterActor.GetRoutable::new, Duration.ofSeconds(5),
              client.scheduler())
          .toCompletableFuture().get();
      if (r.prefill().contains(prefillEngineId) && r.decode().contains(decodeEngineId)) {
        return;
      }
      TimeUnit.MILLISECONDS.sleep(100);
    }
    throw new IllegalStateException("the router does not route to " + prefillEngineId + " and "
        + decodeEngineId + " after " + JOIN_TIMEOUT.toSeconds() + " s; it knows " + r);
  }

  /** Block counts of one simulated engine. */
  public EngineService.Stats stats(ActorRef<EngineService.Command> sim) throws Exception {
    return AskPattern.ask(sim, EngineService.GetStats::new, Duration.ofSeconds(5), client.scheduler())
        .toCompletableFuture().get();
  }

  /** Routes one request through the router; the reply comes when it ended on both sides. */
  public CompletionStage<RouterActor.Routed> route(RequestSpec spec, TransferMode mode,
      Duration timeout) {
    return PekkoFutures.plain(AskPattern.ask(routerRef,
        (ActorRef<RouterActor.Routed> to) -> new RouterActor.Route(spec, mode, to),
        timeout, client.scheduler()));
  }

  private String seed() {
    return clusterHost + ":" + routerPort;
  }

  private int managementPort(String name) throws IOException {
    Integer port = managementPorts.get(name);
    if (port == null) {
      port = FreePorts.next();
      managementPorts.put(name, port);
    }
    return port;
  }

  private List<String> nodeArgs(String role, String id, String mode, String seed, int numBlocks,
      int tp, int blockSize, int managementPort) throws IOException {
    List<String> a = new ArrayList<>(List.of(
        "node", "--role", role, "--engine-id", id, "--mode", mode,
        "--port", Integer.toString(FreePorts.next()),
        "--management-port", Integer.toString(managementPort),
        "--seed-nodes", seed));
    a.addAll(options.geometryFlags(numBlocks, tp, blockSize));
    return a;
  }

  private List<RequestSpec> workload(String mode) {
    Random r = new Random(options.seed());
    List<RequestSpec> specs = new ArrayList<>();
    RequestSpec.Abort[] kinds = {
      RequestSpec.Abort.PREFILL_BEFORE_SCHEDULE,
      RequestSpec.Abort.PREFILL_MID,
      RequestSpec.Abort.DECODE_BEFORE_SCHEDULE
    };
    for (int i = 0; i < options.requests(); i++) {
      int prompt = options.promptMin() + r.nextInt(options.promptMax() - options.promptMin() + 1);
      int cached = 0;
      // D's prefix hits are in D's blocks; across block sizes the planner cannot place them.
      int blockSize = options.blockSizeD();
      boolean hit = r.nextDouble() < options.prefixHitRate();
      if (hit && prompt > blockSize && options.blockSizeP() == blockSize) {
        int blocks = (prompt - 1) / blockSize;
        cached = r.nextInt(blocks + 1) * blockSize;
      }
      RequestSpec.Abort abort =
          r.nextDouble() < options.abortRate() ? kinds[r.nextInt(kinds.length)] : RequestSpec.Abort.NONE;
      specs.add(new RequestSpec(mode + "-req-" + i, prompt, cached, abort));
    }
    return specs;
  }

  private ModeReport runWorkload(
      String mode,
      ActorRef<RouterActor.Command> router,
      ActorRef<EngineService.Command> pSim,
      ActorRef<EngineService.Command> dSim)
      throws Exception {
    List<RequestSpec> specs = workload(mode);
    ConcurrentLinkedQueue<RouterActor.Routed> results = new ConcurrentLinkedQueue<>();
    Semaphore window = new Semaphore(options.concurrency());
    Duration perRequest = Duration.ofSeconds(120);
    long start = System.nanoTime();
    try (ProgressBar bar = progressBar(mode.toUpperCase() + " mode", specs.size())) {
      List<CompletableFuture<?>> all = new ArrayList<>();
      for (RequestSpec spec : specs) {
        window.acquire();
        CompletionStage<RouterActor.Routed> reply =
            PekkoFutures.plain(AskPattern.ask(router,
                (ActorRef<RouterActor.Routed> to) ->
                    new RouterActor.Route(spec, TransferMode.parse(mode), to),
                perRequest, client.scheduler()));
        all.add(reply.handle((routed, error) -> {
          results.add(routed != null ? routed : new RouterActor.Routed(spec.requestId(), "", "", null,
              Outcome.Status.FAILED, 0, 0, "no answer from the router: " + error));
          window.release();
          if (bar != null) {
            bar.step();
          }
          return null;
        }).toCompletableFuture());
      }
      CompletableFuture.allOf(all.toArray(new CompletableFuture<?>[0])).get();
    }
    double seconds = (System.nanoTime() - start) / 1e9;
    int leaked;
    try {
      leaked = awaitBlocksFree(pSim) + awaitBlocksFree(dSim);
    } catch (Exception e) {
      for (ChildProcess c : children) {
        if (c.exitedUnexpectedly()) {
          throw new IllegalStateException(c.exitDescription() + " during the " + mode
              + " workload; its log (" + c.log() + ") ends with:\n" + c.tail(20), e);
        }
      }
      throw e;
    }
    return summarize(mode, specs.size(), results, seconds, leaked);
  }

  private ModeReport summarize(
      String mode, int requests, Iterable<RouterActor.Routed> results, double seconds, int leaked) {
    int completed = 0;
    int aborted = 0;
    int failed = 0;
    int mismatches = 0;
    long bytes = 0;
    List<Double> latencies = new ArrayList<>();
    List<String> problems = new ArrayList<>();
    for (RouterActor.Routed r : results) {
      switch (r.status()) {
        case DONE -> {
          completed++;
          bytes += r.bytes();
          latencies.add(r.transferNanos() / 1e6);
        }
        case ABORTED -> aborted++;
        case MISMATCH -> {
          mismatches++;
          problems.add("MISMATCH " + r.detail());
        }
        case FAILED -> {
          failed++;
          problems.add("FAILED " + r.requestId() + ": " + r.detail());
        }
      }
    }
    if (leaked > 0) {
      problems.add(leaked + " blocks still allocated after the workload");
    }
    for (ChildProcess c : children) {
      if (c.exitedUnexpectedly()) {
        problems.add(c.exitDescription() + "; its log: " + c.log());
      }
    }
    if (completed == 0) {
      problems.add("no request completed: nothing was moved and verified");
    }
    Collections.sort(latencies);
    double p50 = percentile(latencies, 0.50);
    double p99 = percentile(latencies, 0.99);
    double gbps = seconds > 0 ? bytes / seconds / 1e9 : 0;
    return new ModeReport(mode, requests, completed, aborted, failed, bytes, seconds, gbps, p50, p99,
        mismatches, leaked, problems);
  }

  private static double percentile(List<Double> sorted, double q) {
    if (sorted.isEmpty()) {
      return 0;
    }
    int i = (int) Math.ceil(q * sorted.size()) - 1;
    return sorted.get(Math.max(0, Math.min(sorted.size() - 1, i)));
  }

  /** Blocks still allocated on an engine once its transfers have drained (0 when none leaked). */
  private int awaitBlocksFree(ActorRef<EngineService.Command> sim) throws Exception {
    long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(15);
    EngineService.Stats s;
    do {
      s = AskPattern.ask(sim, EngineService.GetStats::new, Duration.ofSeconds(5), client.scheduler())
          .toCompletableFuture().get();
      if (s.freeBlocks() == s.numBlocks()) {
        return 0;
      }
      TimeUnit.MILLISECONDS.sleep(100);
    } while (System.nanoTime() < deadline);
    return s.numBlocks() - s.freeBlocks();
  }

  private @Nullable ProgressBar progressBar(String task, int total) {
    if (!options.progress()) {
      return null;
    }
    return new ProgressBarBuilder()
        .setTaskName(task)
        .setInitialMax(total)
        .setStyle(ProgressBarStyle.ASCII)
        .setConsumer(new me.tongfei.progressbar.ConsoleProgressBarConsumer(System.err))
        .setUpdateIntervalMillis(100)
        .build();
  }

  private ChildProcess start(String name, NodePlacement placement, List<String> args)
      throws IOException {
    List<String> jvmArgs = new ArrayList<>(CHILD_JVM_ARGS);
    jvmArgs.addAll(inheritedProperties());
    clusterSettings.forEach((k, v) -> jvmArgs.add("-D" + k + "=" + v));
    // The tcp data port listens where the node's cluster traffic does.
    jvmArgs.add("-Dkvferry.node.tcp.bind-host=" + placement.host());
    ChildProcess c = ChildProcess.start(name, logDir, placement.commandPrefix(), jvmArgs, args);
    children.add(c);
    return c;
  }

  /**
   * This JVM's {@code kvferry.cuda.*} settings (where libcudart and libcuda are, when the loader
   * does not find them), as flags for the child JVMs: they need the same libraries. Also {@code
   * kvferry.stamps}, so the nodes log their stage stamps when the demo was asked to.
   */
  static List<String> inheritedProperties() {
    List<String> flags = new ArrayList<>();
    System.getProperties().stringPropertyNames().stream()
        .filter(k -> k.startsWith("kvferry.cuda.") || k.equals("kvferry.stamps"))
        .sorted()
        .forEach(k -> flags.add("-D" + k + "=" + System.getProperty(k)));
    return flags;
  }

  private ActorSystem<Void> startClient(String seed) throws IOException {
    Map<String, Object> settings = new java.util.HashMap<>(clusterSettings);
    settings.putAll(Map.of(
        "pekko.remote.artery.canonical.port", FreePorts.next(),
        "pekko.remote.artery.canonical.hostname", clusterHost,
        "pekko.cluster.seed-nodes", List.of("pekko://kvferry@" + seed),
        "pekko.cluster.roles", List.of("client"),
        "pekko.loglevel", "WARNING",
        // The demo bounds the wait itself (and says which process to look at).
        "pekko.cluster.shutdown-after-unsuccessful-join-seed-nodes", "off",
        "pekko.coordinated-shutdown.exit-jvm", "off"));
    Config config = KvferryConfig.load(settings);
    return ActorSystem.create(Behaviors.empty(), "kvferry", config);
  }

  /** Waits until the cluster lists one actor under {@code key} that {@code match}es. */
  private <T> ActorRef<T> awaitOne(
      ServiceKey<T> key, java.util.function.Predicate<ActorRef<T>> match, String what,
      @Nullable ChildProcess process) throws Exception {
    long deadline = System.nanoTime() + JOIN_TIMEOUT.toNanos();
    while (System.nanoTime() < deadline) {
      for (ChildProcess c : process != null ? List.of(process) : children) {
        if (!c.isAlive() && c.exitedUnexpectedly()) {
          throw new IllegalStateException(c.exitDescription() + " while waiting for " + what
              + "; its log (" + c.log() + ") ends with:\n" + c.tail(20));
        }
      }
      Set<ActorRef<T>> found = find(key);
      for (ActorRef<T> r : found) {
        if (match.test(r)) {
          return r;
        }
      }
      TimeUnit.MILLISECONDS.sleep(200);
    }
    throw new IllegalStateException(what + " did not join the cluster within "
        + JOIN_TIMEOUT.toSeconds() + " s; logs in " + logDir
        + (process == null ? "" : "; " + process.name() + "'s ends with:\n" + process.tail(20)));
  }

  private <T> Set<ActorRef<T>> find(ServiceKey<T> key) throws Exception {
    Receptionist.Listing l =
        AskPattern.ask(client.receptionist(),
                (ActorRef<Receptionist.Listing> to) -> Receptionist.find(key, to),
                Duration.ofSeconds(5), client.scheduler())
            .toCompletableFuture().get();
    return l.getServiceInstances(key);
  }


  /** Prints the per-mode table. */
  public static void printTable(List<ModeReport> reports, PrintStream out) {
    out.println();
    out.printf("%-6s %8s %8s %7s %6s %10s %7s %9s %9s %10s %7s%n", "mode", "requests", "complete",
        "aborted", "failed", "bytes", "GB/s", "p50 ms", "p99 ms", "mismatches", "leaked");
    for (ModeReport r : reports) {
      out.printf("%-6s %8d %8d %7d %6d %10s %7.2f %9.2f %9.2f %10d %7d%n", r.mode(), r.requests(),
          r.completed(), r.aborted(), r.failed(), human(r.bytes()), r.gbps(), r.p50Ms(), r.p99Ms(),
          r.mismatches(), r.leakedBlocks());
    }
    for (ModeReport r : reports) {
      r.problems().stream().limit(10).forEach(p -> out.println(r.mode() + ": " + p));
    }
  }

  /** The one-line JSON summary {@code {"modes": {"write": {...}, ...}}}. */
  public static String toJson(List<ModeReport> reports) {
    return reports.stream()
        .map(r -> String.format(java.util.Locale.ROOT,
            "\"%s\": {\"requests\": %d, \"completed\": %d, \"aborted\": %d, \"failed\": %d,"
                + " \"bytes\": %d, \"gbps\": %.3f, \"p50_ms\": %.3f, \"p99_ms\": %.3f,"
                + " \"mismatches\": %d, \"leaked_blocks\": %d}",
            r.mode(), r.requests(), r.completed(), r.aborted(), r.failed(), r.bytes(), r.gbps(),
            r.p50Ms(), r.p99Ms(), r.mismatches(), r.leakedBlocks()))
        .collect(Collectors.joining(", ", "{\"modes\": {", "}}"));
  }

  private static String human(long bytes) {
    if (bytes >= 1L << 30) {
      return String.format("%.2f GiB", bytes / (double) (1L << 30));
    }
    return String.format("%.1f MiB", bytes / (double) (1L << 20));
  }

  @Override
  public void close() {
    // Stop them all at once, then wait: each takes seconds to leave the cluster.
    children.parallelStream().forEach(ChildProcess::close);
    children.clear();
    if (client != null) {
      client.terminate();
    }
  }
}
