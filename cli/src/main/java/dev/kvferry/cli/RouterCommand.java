package dev.kvferry.cli;

import dev.kvferry.node.RouterNode;
import java.util.List;
import java.util.Map;
import java.util.concurrent.Callable;
import java.util.concurrent.CountDownLatch;
import picocli.CommandLine.Command;
import picocli.CommandLine.Mixin;

/** {@code kvferry router}: the request router, picking a P and a D per request. */
@Command(name = "router", mixinStandardHelpOptions = true,
    description = "Start a router that picks a prefill and a decode engine for each request.")
public final class RouterCommand implements Callable<Integer> {

  @Mixin ClusterOptions cluster = new ClusterOptions();

  @Override
  public Integer call() throws Exception {
    RouterNode node = RouterNode.start(cluster.toConfig(List.of("router"), Map.of()));
    java.net.URI management = dev.kvferry.management.ManagementServer.start(node.system());
    System.out.println("kvferry router up at " + cluster.host + ":" + cluster.port
          + ", management " + management);
    CountDownLatch stopped = new CountDownLatch(1);
    node.system().getWhenTerminated().thenRun(stopped::countDown);
    stopped.await();
    return 0;
  }
}
