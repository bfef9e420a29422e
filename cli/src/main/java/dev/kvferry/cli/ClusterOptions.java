package dev.kvferry.cli;

import com.typesafe.config.Config;
import dev.kvferry.node.KvferryConfig;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import picocli.CommandLine.Option;

/** Flags every clustered process takes: where it listens and which seed nodes it joins. */
public final class ClusterOptions {

  @Option(names = "--host", description = "Host to bind and advertise for cluster traffic (default: ${DEFAULT-VALUE}).",
      defaultValue = "127.0.0.1")
  String host;

  @Option(names = "--port", description = "Cluster (Artery) port (default: ${DEFAULT-VALUE}).",
      defaultValue = "25520")
  int port;

  @Option(names = "--management-port",
      description = "Management HTTP port, bound to 127.0.0.1 unless --management-host (default: ${DEFAULT-VALUE}).",
      defaultValue = "8558")
  int managementPort;

  @Option(names = "--management-host", description = "Management HTTP bind host (default: ${DEFAULT-VALUE}).",
      defaultValue = "127.0.0.1")
  String managementHost;

  @Option(names = "--seed-nodes", split = ",",
      description = "Seed nodes as host:port, comma separated (default: this node itself).")
  List<String> seedNodes = new ArrayList<>();

  /** The config for a process with these flags and the given cluster roles. */
  public Config toConfig(List<String> roles, Map<String, Object> extra) {
    Map<String, Object> m = new HashMap<>(extra);
    m.put("pekko.remote.artery.canonical.hostname", host);
    m.put("pekko.remote.artery.canonical.port", port);
    m.put("pekko.management.http.hostname", managementHost);
    m.put("pekko.management.http.bind-hostname", managementHost);
    m.put("pekko.management.http.port", managementPort);
    List<String> seeds = new ArrayList<>();
    for (String s : seedNodes.isEmpty() ? List.of(host + ":" + port) : seedNodes) {
      seeds.add(seedAddress(s));
    }
    m.put("pekko.cluster.seed-nodes", seeds);
    m.put("pekko.cluster.roles", roles);
    return KvferryConfig.load(m);
  }

  static String seedAddress(String hostPort) {
    String s = hostPort.trim();
    if (s.startsWith("pekko://")) {
      return s;
    }
    int colon = s.lastIndexOf(':');
    if (colon <= 0 || colon == s.length() - 1) {
      throw new IllegalArgumentException("seed node '" + s + "' must be host:port");
    }
    Integer.parseInt(s.substring(colon + 1));
    return "pekko://kvferry@" + s;
  }
}
