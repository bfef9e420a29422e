package dev.kvferry.cli;

import dev.kvferry.node.RouterNode;
import java.util.List;
import java.util.Map;
import java.util.concurrent.Callable;
import java.util.concurrent.CountDownLatch;
import picocli.CommandLine.Command;
import org.jspecify.annotations.Nullable;
import picocli.CommandLine.Mixin;
import picocli.CommandLine.Option;

/** {@code kvferry router}: the request router, picking a P and a D per request. */
@Command(name = "router", mixinStandardHelpOptions = true,
    description = "Start a router that picks a prefill and a decode engine for each request.")
public final class RouterCommand implements Callable<Integer> {

  @Mixin ClusterOptions cluster = new ClusterOptions();

  @Option(names = "--http-port", paramLabel = "N",
      description = "Serve OpenAI-compatible HTTP (/v1/completions, /v1/chat/completions,"
          + " /v1/models) on port N (0 = any free port) as the proxy in front of the engines that"
          + " registered an HTTP URL through the engine port. Default: off.")
  @Nullable Integer httpPort;

  @Option(names = "--http-host", paramLabel = "HOST",
      description = "Address the HTTP proxy binds (default: 127.0.0.1).")
  String httpHost = "127.0.0.1";

  @Option(names = "--max-in-flight-per-engine", paramLabel = "N",
      description = "Requests in flight on one engine before the proxy picks another or answers"
          + " 503 (default: 64).")
  int maxInFlight = 64;

  @Override
  public Integer call() throws Exception {
    Map<String, Object> m = new java.util.HashMap<>();
    if (httpPort != null) {
      m.put("kvferry.router.http.port", httpPort);
      m.put("kvferry.router.http.host", httpHost);
      m.put("kvferry.router.http.max-in-flight-per-engine", maxInFlight);
    }
    RouterNode node = RouterNode.start(cluster.toConfig(List.of("router"), m));
    java.net.URI management = dev.kvferry.management.ManagementServer.start(node.system());
    System.out.println("kvferry router up at " + cluster.host + ":" + cluster.port
          + ", management " + management);
    node.httpAddress().ifPresent(a -> System.out.println("kvferry router: OpenAI-compatible HTTP"
        + " at http://" + a.getHostString() + ":" + a.getPort() + "/v1"));
    CountDownLatch stopped = new CountDownLatch(1);
    node.system().getWhenTerminated().thenRun(stopped::countDown);
    stopped.await();
    return 0;
  }
}
