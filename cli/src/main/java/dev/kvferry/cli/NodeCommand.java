package dev.kvferry.cli;

import dev.kvferry.node.EngineNode;
import dev.kvferry.rdma.cuda.Cuda;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.Callable;
import java.util.concurrent.CountDownLatch;
import org.jspecify.annotations.Nullable;
import picocli.CommandLine.Command;
import picocli.CommandLine.Model.CommandSpec;
import picocli.CommandLine.Mixin;
import picocli.CommandLine.Option;
import picocli.CommandLine.Spec;

/** {@code kvferry node}: one engine node (prefill or decode) in the cluster. */
@Command(name = "node", mixinStandardHelpOptions = true,
    description = "Start an engine node (prefill or decode) that joins the kvferry cluster.")
public final class NodeCommand implements Callable<Integer> {

  @Mixin ClusterOptions cluster = new ClusterOptions();

  @Option(names = "--role", required = true, description = "prefill or decode")
  String role;

  @Option(names = "--engine-id", description = "Engine id (default: <role>-<host>-<port>-dp<rank>).")
  @Nullable String engineId;

  @Option(names = "--dp-rank", defaultValue = "0", description = "DP rank (default: ${DEFAULT-VALUE}).")
  int dpRank;

  @Option(names = "--dp-size", defaultValue = "1", description = "DP size (default: ${DEFAULT-VALUE}).")
  int dpSize;

  @Option(names = "--tp-size", defaultValue = "1", description = "TP size (default: ${DEFAULT-VALUE}).")
  int tpSize;

  @Option(names = "--mode", defaultValue = "write",
      description = "write, read, or write,read for one engine per mode (default: ${DEFAULT-VALUE}).")
  String mode;

  @Option(names = "--transport",
      description = "cma, tcp, ucx, local or cuda (default: cma; cuda with --gpu). ucx: UCX's "
          + "transports from kvferry.node.ucx.transports or UCX_TLS.")
  @Nullable String transport;

  @Option(names = "--gpu", paramLabel = "N",
      description = "Keep the KV cache on CUDA device N (the simulated engine fills and checks it"
          + " with kernels); implies --transport cuda. Default: host memory.")
  @Nullable Integer gpu;

  @Mixin GeometryOptions geometry = new GeometryOptions();

  @Option(names = "--engine", paramLabel = "KIND",
      description = "What drives the node's connector: sim (the simulated engine, default), none"
          + " (a KV cache nothing drives) or port (an engine process through --engine-socket;"
          + " docs/engine-port.md).")
  @Nullable String engine;

  @Option(names = "--engine-socket", paramLabel = "PATH",
      description = "With --engine port: the Unix domain socket the engine process connects to"
          + " (created mode 0600).")
  @Nullable String engineSocket;

  @Option(names = "--no-simulated-engine", description = "The same as --engine none.")
  boolean noSimulator;

  @Spec CommandSpec spec;

  @Override
  public Integer call() throws Exception {
    if (transport == null) {
      transport = gpu != null ? "cuda" : "cma";
    }
    if (gpu != null && !Cuda.available()) {
      spec.commandLine().getErr().println("kvferry node: --gpu " + gpu + ": CUDA not available: "
          + Cuda.unavailableReason());
      return 2;
    }
    Map<String, Object> m = new HashMap<>(geometry.toConfigMap("kvferry.node.kv-cache"));
    m.put("kvferry.node.role", role);
    if (engineId != null) {
      m.put("kvferry.node.engine-id", engineId);
    }
    m.put("kvferry.node.dp-rank", dpRank);
    m.put("kvferry.node.dp-size", dpSize);
    m.put("kvferry.node.tp-size", tpSize);
    m.put("kvferry.node.mode", mode);
    m.put("kvferry.node.transport", transport);
    if (gpu != null) {
      m.put("kvferry.node.gpu", gpu);
    }
    m.put("kvferry.node.tcp.bind-host", cluster.host);
    if (noSimulator && engine != null && !engine.equals("none")) {
      spec.commandLine().getErr().println("kvferry node: --no-simulated-engine contradicts --engine "
          + engine);
      return 2;
    }
    if (engineSocket != null) {
      if (engine == null) {
        engine = "port"; // a socket only means something to the port
      } else if (!engine.equals("port")) {
        spec.commandLine().getErr().println("kvferry node: --engine-socket needs --engine port, not "
            + engine);
        return 2;
      }
      m.put("kvferry.node.engine-port.socket", engineSocket);
    }
    if (noSimulator) {
      m.put("kvferry.node.engine", "none");
    } else if (engine != null) {
      m.put("kvferry.node.engine", engine);
    }
    EngineNode node = EngineNode.start(cluster.toConfig(List.of(role), m));
    java.net.URI management = dev.kvferry.management.ManagementServer.start(node.system());
    node.engineSocket().ifPresent(socket -> System.out.println("kvferry node: engine port at "
        + socket + " (" + role + ", " + mode + ", " + transport + ") up at " + cluster.host + ":"
        + cluster.port + ", management " + management));
    for (EngineNode.Engine e : node.engines()) {
      System.out.println("kvferry node: engine " + e.engineId() + " (" + role + ", "
          + e.mode().configName() + ", " + transport + (gpu != null ? ", KV cache on GPU " + gpu : "")
          + ") up at " + cluster.host + ":" + cluster.port
          + ", management " + management);
    }
    CountDownLatch stopped = new CountDownLatch(1);
    node.system().getWhenTerminated().thenRun(stopped::countDown);
    stopped.await();
    return 0;
  }
}
