package dev.kvferry.it;

import dev.kvferry.demo.NodePlacement;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.concurrent.TimeUnit;

/**
 * A small network made for one test: a bridge in this (the test's) namespace with an address of
 * its own, and one network namespace per name, each joined to the bridge by a veth pair. Processes
 * started in a namespace reach the bridge's address and each other over the bridge;
 * {@link #isolate} cuts one namespace off (its bridge port goes down: silence, no resets, as a
 * pulled cable) and {@link #heal} plugs it back. Needs root (CAP_NET_ADMIN) and iproute2; {@link
 * #unavailableReason} says why not before a test starts anything.
 */
final class NetworkLab implements AutoCloseable {

  private final String prefix;
  private final String subnet;
  private final Map<String, Integer> hostIndex = new LinkedHashMap<>();
  private boolean closed;

  private NetworkLab(String prefix, String subnet) {
    this.prefix = prefix;
    this.subnet = subnet;
  }

  /** Why this machine cannot make namespaces, or empty when it can. */
  static Optional<String> unavailableReason() {
    String probe = "kvfprobe" + ProcessHandle.current().pid() % 100000;
    try {
      ip("netns", "add", probe);
      ip("netns", "del", probe);
      return Optional.empty();
    } catch (IOException e) {
      return Optional.of("cannot create network namespaces here (needs root and iproute2): "
          + e.getMessage());
    }
  }

  /** Creates the bridge and one namespace per name (at most 200). */
  static NetworkLab create(List<String> names) throws IOException {
    long pid = ProcessHandle.current().pid();
    // Interface names are at most 15 bytes: "kvf" + 5 digits + a suffix of up to 4.
    String prefix = "kvf" + pid % 100000;
    NetworkLab lab = new NetworkLab(prefix, freeSubnet(pid));
    try {
      lab.build(names);
    } catch (IOException | RuntimeException e) {
      lab.close();
      throw e;
    }
    return lab;
  }

  private void build(List<String> names) throws IOException {
    ip("link", "add", bridge(), "type", "bridge");
    ip("addr", "add", subnet + ".1/24", "dev", bridge());
    ip("link", "set", bridge(), "up");
    int index = 2;
    for (String name : names) {
      hostIndex.put(name, index);
      String ns = namespace(name);
      ip("netns", "add", ns);
      ip("link", "add", outside(name), "type", "veth", "peer", "name", "eth0", "netns", ns);
      ip("link", "set", outside(name), "master", bridge());
      ip("link", "set", outside(name), "up");
      ip("-n", ns, "addr", "add", subnet + "." + index + "/24", "dev", "eth0");
      ip("-n", ns, "link", "set", "eth0", "up");
      ip("-n", ns, "link", "set", "lo", "up");
      index++;
    }
  }

  /** The bridge's address: processes in this namespace bind it to be reachable from every name. */
  String bridgeHost() {
    return subnet + ".1";
  }

  String host(String name) {
    return subnet + "." + index(name);
  }

  /** Runs a process inside {@code name}'s namespace, bound to its address there. */
  NodePlacement placement(String name) {
    return NodePlacement.inNamespace(namespace(name), host(name));
  }

  /** Cuts {@code name} off from the bridge and every other namespace. */
  void isolate(String name) throws IOException {
    ip("link", "set", outside(name), "down");
  }

  /** Undoes {@link #isolate}. */
  void heal(String name) throws IOException {
    ip("link", "set", outside(name), "up");
  }

  @Override
  public void close() {
    if (closed) {
      return;
    }
    closed = true;
    // Deleting a namespace deletes its veth end and with it the peer.
    for (String name : hostIndex.keySet()) {
      quietly("netns", "del", namespace(name));
    }
    quietly("link", "del", bridge());
  }

  private int index(String name) {
    Integer i = hostIndex.get(name);
    if (i == null) {
      throw new IllegalArgumentException("no namespace named " + name + " in " + hostIndex.keySet());
    }
    return i;
  }

  private String bridge() {
    return prefix + "br";
  }

  private String namespace(String name) {
    return prefix + "-" + name;
  }

  private String outside(String name) {
    return prefix + "v" + index(name);
  }

  /** A 10.213.x.0/24 no route of this namespace uses yet. */
  private static String freeSubnet(long pid) throws IOException {
    String routes = ip("-4", "route", "show", "table", "all");
    for (int i = 0; i < 250; i++) {
      String candidate = "10.213." + (1 + (pid + i) % 250);
      if (!routes.contains(candidate + ".")) {
        return candidate;
      }
    }
    throw new IOException("no free 10.213.x.0/24 subnet for the test network");
  }

  private static void quietly(String... args) {
    try {
      ip(args);
    } catch (IOException e) {
      // Cleanup of something that may already be gone.
    }
  }

  private static String ip(String... args) throws IOException {
    List<String> cmd = new ArrayList<>(List.of("ip"));
    cmd.addAll(List.of(args));
    Process p;
    try {
      p = new ProcessBuilder(cmd).redirectErrorStream(true).start();
    } catch (IOException e) {
      throw new IOException("cannot run ip (iproute2 missing?): " + e.getMessage(), e);
    }
    try {
      String out = new String(p.getInputStream().readAllBytes(), StandardCharsets.UTF_8);
      if (!p.waitFor(30, TimeUnit.SECONDS)) {
        p.destroyForcibly();
        throw new IOException(String.join(" ", cmd) + " did not finish in 30 s");
      }
      if (p.exitValue() != 0) {
        throw new IOException(String.join(" ", cmd) + " failed (" + p.exitValue() + "): "
            + out.strip());
      }
      return out;
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      p.destroyForcibly();
      throw new IOException("interrupted running " + String.join(" ", cmd), e);
    }
  }
}
