package dev.kvferry.rdma;

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.Base64;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/**
 * The peer process of {@link CrossProcessTransferTest} and {@link UcxTransportTest}: registers one
 * host region, prints its descriptor for each transport named (args: region bytes, then the
 * transports, default {@code cma,tcp}; ucx reads UCX_TLS from this process's environment and its
 * progress thread serves the parent's puts and gets; then optionally the transport whose {@link
 * Transport#allocateHost} allocates the region, default the registry), then answers commands on
 * stdin until stdin closes.
 *
 * <pre>
 * FILL seed offset length        -> OK
 * CRC offset length              -> CRC value
 * READ transport descriptor(base64) localOffset remoteOffset length blockBytes
 *                                -> OK crc-of-local-range | FAILED reason
 * </pre>
 */
public final class ChildRegionHolder {
  public static void main(String[] args) throws Exception {
    long regionBytes = Long.parseLong(args[0]);
    List<String> names = List.of((args.length > 1 ? args[1] : "cma,tcp").split(","));
    String owner = "child-" + ProcessHandle.current().pid();
    Map<String, Transport> transports = new LinkedHashMap<>();
    try (RegionRegistry registry = new RegionRegistry(owner)) {
      for (String name : names) {
        transports.put(name, switch (name) {
          case "cma" -> new CmaTransport();
          case "tcp" -> new TcpTransport(registry, TransportOptions.defaults());
          case "ucx" -> new UcxTransport(TransportOptions.defaults());
          default -> throw new IllegalArgumentException("no transport " + name);
        });
      }
      MemoryRegion region = args.length > 2
          ? transports.get(args[2]).allocateHost(registry, regionBytes)
          : registry.allocateHost(regionBytes);
      Base64.Encoder b64 = Base64.getEncoder();
      for (Map.Entry<String, Transport> t : transports.entrySet()) {
        System.out.println("DESCRIPTOR " + t.getKey() + " "
            + b64.encodeToString(t.getValue().describe(region).pack()));
      }
      System.out.flush();
      serve(region, transports);
    } finally {
      transports.values().forEach(Transport::close);
    }
  }

  private static void serve(MemoryRegion region, Map<String, Transport> transports)
      throws java.io.IOException, MalformedDescriptorException {
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
        case "READ" -> {
          Transport t = transports.get(w[1]);
          RegionDescriptor remote = RegionDescriptor.unpack(Base64.getDecoder().decode(w[2]));
          long localOffset = Long.parseLong(w[3]);
          long remoteOffset = Long.parseLong(w[4]);
          int length = Integer.parseInt(w[5]);
          int block = Integer.parseInt(w[6]);
          int n = length / block;
          long[] lo = new long[n];
          long[] ro = new long[n];
          long[] sz = new long[n];
          for (int i = 0; i < n; i++) {
            lo[i] = localOffset + (long) i * block;
            ro[i] = remoteOffset + (long) i * block;
            sz[i] = block;
          }
          TransferStatus s = Patterns.await(t.read(region, remote, new TransferBatch(lo, ro, sz)));
          System.out.println(
              s.succeeded()
                  ? "OK " + Patterns.crc(region, localOffset, length)
                  : "FAILED " + s.failureMessage());
        }
        default -> System.out.println("UNKNOWN " + line);
      }
      System.out.flush();
    }
  }
}
