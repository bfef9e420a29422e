package dev.kvferry.demo;

import java.util.List;

/**
 * Where the demo runs a process: the command its JVM is started through (empty: directly; {@code
 * ip netns exec NS}: inside network namespace NS) and the address it binds for cluster, data-plane
 * and management traffic. Fault tests place nodes in namespaces to cut the network between them.
 */
public record NodePlacement(List<String> commandPrefix, String host) {

  /** Started directly, everything on loopback: the demo's default. */
  public static final NodePlacement LOOPBACK = new NodePlacement(List.of(), "127.0.0.1");

  public NodePlacement {
    commandPrefix = List.copyOf(commandPrefix);
    if (host == null || host.isBlank()) {
      throw new IllegalArgumentException("a placement needs a host to bind");
    }
  }

  /** Inside network namespace {@code namespace}, bound to {@code host} there. */
  public static NodePlacement inNamespace(String namespace, String host) {
    return new NodePlacement(List.of("ip", "netns", "exec", namespace), host);
  }

  public NodePlacement withHost(String otherHost) {
    return new NodePlacement(commandPrefix, otherHost);
  }
}
