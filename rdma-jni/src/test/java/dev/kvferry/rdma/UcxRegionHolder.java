package dev.kvferry.rdma;

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.Base64;

/**
 * The peer process of {@link UcxTransportTest}: registers one host region, prints its ucx
 * descriptor (UCX reads UCX_TLS from this process's environment), then answers commands on stdin
 * until stdin closes. Its progress thread serves the parent's puts and gets meanwhile.
 *
 * <pre>
 * FILL seed offset length        -> OK
 * CRC offset length              -> CRC value
 * </pre>
 */
public final class UcxRegionHolder {
  public static void main(String[] args) throws Exception {
    long regionBytes = Long.parseLong(args[0]);
    String owner = "ucx-child-" + ProcessHandle.current().pid();
    try (RegionRegistry registry = new RegionRegistry(owner);
        UcxTransport ucx = new UcxTransport(TransportOptions.defaults())) {
      MemoryRegion region = registry.allocateHost(regionBytes);
      System.out.println(
          "DESCRIPTOR ucx " + Base64.getEncoder().encodeToString(ucx.describe(region).pack()));
      System.out.flush();
      BufferedReader in =
          new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
      String line;
      while ((line = in.readLine()) != null) {
        String[] w = line.trim().split(" ");
        switch (w[0]) {
          case "FILL" -> {
            Patterns.fill(region, Long.parseLong(w[2]), Integer.parseInt(w[3]), Long.parseLong(w[1]));
            System.out.println("OK");
          }
          case "CRC" -> System.out.println(
              "CRC " + Patterns.crc(region, Long.parseLong(w[1]), Integer.parseInt(w[2])));
          default -> System.out.println("UNKNOWN " + line);
        }
        System.out.flush();
      }
    }
  }
}
