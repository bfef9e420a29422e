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
  /** What this lab created, so close() removes exactly that (never another run's). */
  private final List<String> createdNamespaces = new ArrayList<>();
  private boolean createdBridge;
  private final Thread cleanupOnExit = new Thread(this::close, "network-lab-cleanup");
  private boolean closed;

  private NetworkLab(String prefix, String subnet) {
    this.prefix = prefix;
    this.subnet = subnet;
  }

  /** Why this machine cannot make namespaces, or empty when it can. */
  static Optional<String> unavailableReason() {
    String probe = String.format("kvfprobe%06x", new java.security.SecureRandom().nextInt(1 << 24));
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
    // Interface names are at most 15 bytes: "kvf" + 6 random hex digits + a suffix of up to 4.
    // Random, not the pid: containers with their own pid namespaces share pids.
    String prefix = String.format("kvf%06x", new java.security.SecureRandom().nextInt(1 << 24));
    NetworkLab lab = new NetworkLab(prefix, freeSubnet());
    Runtime.getRuntime().addShutdownHook(lab.cleanupOnExit);
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
    createdBridge = true;
    ip("addr", "add", subnet + ".1/24", "dev", bridge());
    ip("link", "set", bridge(), "up");
    int index = 2;
    for (String name : names) {
      hostIndex.put(name, index);
      String ns = namespace(name);
      ip("netns", "add", ns);
      createdNamespaces.add(ns);
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
    for (String ns : createdNamespaces) {
      quietly("netns", "del", ns);
    }
    if (createdBridge) {
      quietly("link", "del", bridge());
    }
    if (Thread.currentThread() != cleanupOnExit) {
      try {
        Runtime.getRuntime().removeShutdownHook(cleanupOnExit);
      } catch (IllegalStateException shuttingDown) {
        // the hook runs anyway; close() is idempotent
      }
    }
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

  /**
   * A /24 in 198.18.0.0/15 (reserved for network tests, RFC 2544) that overlaps no route of this
   * namespace, so the bridge's address can never shadow a real network.
   */
  private static String freeSubnet() throws IOException {
    List<long[]> routes = new ArrayList<>();
    for (String line : ip("-4", "route", "show", "table", "all").split("\n")) {
      String[] words = line.trim().split("\\s+");
      String target = words.length > 1 && isRouteType(words[0]) ? words[1] : words[0];
      long[] range = cidr(target);
      if (range != null) {
        routes.add(range);
      }
    }
    int start = new java.security.SecureRandom().nextInt(512);
    for (int i = 0; i < 512; i++) {
      int third = (start + i) % 512; // 198.18.0.0 - 198.19.255.0
      long first = (198L << 24) | ((18L + third / 256) << 16) | ((long) (third % 256) << 8);
      long last = first + 255;
      boolean overlaps = false;
      for (long[] r : routes) {
        overlaps |= r[0] <= last && first <= r[1];
      }
      if (!overlaps) {
        return "198." + (18 + third / 256) + "." + (third % 256);
      }
    }
    throw new IOException("no free /24 in 198.18.0.0/15 for the test network");
  }

  private static boolean isRouteType(String word) {
    return List.of("local", "broadcast", "unicast", "blackhole", "unreachable", "prohibit",
        "multicast", "anycast", "throw").contains(word);
  }

  /** First and last address of an IPv4 "a.b.c.d/n" or "a.b.c.d", or null ("default" excluded). */
  private static long[] cidr(String text) {
    String[] parts = text.split("/");
    String[] octets = parts[0].split("\\.");
    if (octets.length != 4) {
      return null;
    }
    try {
      long address = 0;
      for (String o : octets) {
        address = (address << 8) | Integer.parseInt(o);
      }
      int bits = parts.length > 1 ? Integer.parseInt(parts[1]) : 32;
      long size = 1L << (32 - bits);
      long first = address & ~(size - 1) & 0xFFFFFFFFL;
      return new long[] {first, first + size - 1};
    } catch (NumberFormatException e) {
      return null;
    }
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
