package dev.kvferry.bench;

import com.typesafe.config.Config;
import dev.kvferry.node.KvferryConfig;
import java.util.List;
import java.util.Map;

/** Config of the actor systems the bench starts: Artery on loopback, quiet, never exiting the JVM. */
final class BenchCluster {
  private BenchCluster() {}

  /** A cluster node of system {@code systemName} on {@code port}, joining through {@code seedPort}. */
  static Config nodeConfig(String systemName, int port, int seedPort) {
    return KvferryConfig.load(Map.of(
        "pekko.remote.artery.canonical.hostname", "127.0.0.1",
        "pekko.remote.artery.canonical.port", port,
        "pekko.cluster.seed-nodes",
        List.of("pekko://" + systemName + "@127.0.0.1:" + seedPort),
        "pekko.loglevel", "ERROR",
        "pekko.coordinated-shutdown.exit-jvm", "off",
        "pekko.coordinated-shutdown.run-by-jvm-shutdown-hook", "off",
        "pekko.cluster.jmx.enabled", "off"));
  }
}
