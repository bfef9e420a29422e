package dev.kvferry.node;

import java.io.IOException;
import java.net.InetAddress;
import java.net.ServerSocket;
import java.util.HashSet;
import java.util.Set;

/**
 * Picks loopback ports for processes this process starts (demo, tests, benchmarks). The kernel may
 * hand the same ephemeral port out again once the probe socket is closed, so ports already given
 * out by this process are never returned twice: CI once saw a router's management port reused as a
 * node's cluster port.
 */
public final class FreePorts {
  private static final Set<Integer> HANDED_OUT = new HashSet<>();

  private FreePorts() {}

  /** A port free on 127.0.0.1 now and not handed out before by this process. */
  public static synchronized int next() throws IOException {
    for (int attempt = 0; attempt < 100; attempt++) {
      int port;
      try (ServerSocket s = new ServerSocket(0, 1, InetAddress.getLoopbackAddress())) {
        port = s.getLocalPort();
      }
      if (HANDED_OUT.add(port)) {
        return port;
      }
    }
    throw new IOException("no fresh loopback port after 100 attempts");
  }
}
