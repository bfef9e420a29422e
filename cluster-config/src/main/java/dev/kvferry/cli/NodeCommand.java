package dev.kvferry.cli;

import dev.kvferry.node.EngineNode;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.Callable;
import java.util.concurrent.CountDownLatch;
import picocli.CommandLine.Command;
import picocli.CommandLine.Mixin;
import picocli.CommandLine.Option;

/** {@code kvferry node}: one engine node (prefill or decode) in the cluster. */
@Command(name = "node", mixinStandardHelpOptions = true,
    description = "Start an engine node (prefill or decode) that joins the kvferry cluster.")
public final class NodeCommand implements Callable<Integer> {

  @Mixin ClusterOptions cluster = new ClusterOptions();

  @Option(names = "--role", required = true, description = "prefill or decode")
  String role;

  @Option(names = "--engine-id", description = "Engine id (default: <role>-<host>-<port>-dp<rank>).")
  String engineId;

  @Option(names = "--dp-rank", defaultValue = "0", description = "DP rank (default: ${DEFAULT-VALUE}).")
  int dpRank;

  @Option(names = "--dp-size", defaultValue = "1", description = "DP size (default: ${DEFAULT-VALUE}).")
  int dpSize;

  @Option(names = "--tp-size", defaultValue = "1", description = "TP size (default: ${DEFAULT-VALUE}).")
  int tpSize;

  @Option(names = "--mode", defaultValue = "write",
      description = "write, read, or write,read for one engine per mode (default: ${DEFAULT-VALUE}).")
  String mode;

  @Option(names = "--transport", defaultValue = "cma", description = "cma, tcp or local (default: ${DEFAULT-VALUE}).")
  String transport;

  @Mixin GeometryOptions geometry = new GeometryOptions();

  @Option(names = "--no-simulated-engine", description = "Run without the simulated engine.")
  boolean noSimulator;

  @Override
  public Integer call() throws Exception {
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
    m.put("kvferry.node.tcp.bind-host", cluster.host);
    if (noSimulator) {
      m.put("kvferry.node.simulated-engine", false);
    }
    EngineNode node = EngineNode.start(cluster.toConfig(List.of(role), m));
    java.net.URI management = dev.kvferry.management.ManagementServer.start(node.system());
    for (EngineNode.Engine e : node.engines()) {
      System.out.println("kvferry node: engine " + e.engineId() + " (" + role + ", "
          + e.mode().configName() + ", " + transport + ") up at " + cluster.host + ":" + cluster.port
          + ", management " + management);
    }
    CountDownLatch stopped = new CountDownLatch(1);
    node.system().getWhenTerminated().thenRun(stopped::countDown);
    stopped.await();
    return 0;
  }
}
