package dev.kvferry.cli;

import dev.kvferry.management.ManagementServer;
import dev.kvferry.node.EngineNode;
import dev.kvferry.node.FreePorts;
import dev.kvferry.node.KvferryConfig;
import java.util.List;
import java.util.Map;
import java.util.concurrent.Callable;
import java.util.concurrent.TimeUnit;
import org.apache.pekko.cluster.MemberStatus;
import org.apache.pekko.cluster.typed.Cluster;
import picocli.CommandLine.Command;

/**
 * Starts a tiny one-node cluster and stops it again, so that {@code -XX:ArchiveClassesAtExit}
 * records the classes every kvferry process loads at start. The launcher runs it once per build:
 * the archive roughly halves JVM start-up, which dominates the demo on small machines.
 */
@Command(name = "cds-warmup", hidden = true,
    description = "Start and stop a tiny node (used by the launcher to build a class-data archive).")
public final class CdsWarmupCommand implements Callable<Integer> {

  @Override
  public Integer call() throws Exception {
    int port = FreePorts.next();
    EngineNode node = EngineNode.start(KvferryConfig.load(Map.of(
        "pekko.remote.artery.canonical.port", port,
        "pekko.cluster.seed-nodes", List.of("pekko://kvferry@127.0.0.1:" + port),
        "pekko.management.http.port", FreePorts.next(),
        "pekko.coordinated-shutdown.exit-jvm", "off",
        "pekko.loglevel", "WARNING",
        "kvferry.node.kv-cache.layers", 1,
        "kvferry.node.kv-cache.num-blocks", 8,
        "kvferry.node.mode", "write,read")));
    try {
      ManagementServer.start(node.system());
      long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(30);
      while (Cluster.get(node.system()).selfMember().status() != MemberStatus.up()
          && System.nanoTime() < deadline) {
        TimeUnit.MILLISECONDS.sleep(50);
      }
    } finally {
      node.close();
    }
    return 0;
  }

}
