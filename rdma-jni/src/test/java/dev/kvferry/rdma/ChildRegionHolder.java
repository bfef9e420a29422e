package dev.kvferry.rdma;

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.Base64;

/**
 * The peer process of {@link CrossProcessTransferTest}: registers one host region, prints its cma
 * and tcp descriptors, then answers commands on stdin until stdin closes.
 *
 * <pre>
 * FILL seed offset length        -> OK
 * CRC offset length              -> CRC value
 * READ cma|tcp descriptor(base64) localOffset remoteOffset length blockBytes
 *                                -> OK crc-of-local-range | FAILED reason
 * </pre>
 */
public final class ChildRegionHolder {
  public static void main(String[] args) throws Exception {
    long regionBytes = Long.parseLong(args[0]);
    String owner = "child-" + ProcessHandle.current().pid();
    try (RegionRegistry registry = new RegionRegistry(owner);
        CmaTransport cma = new CmaTransport();
        TcpTransport tcp = new TcpTransport(registry, TransportOptions.defaults())) {
      MemoryRegion region = registry.allocateHost(regionBytes);
      Base64.Encoder b64 = Base64.getEncoder();
      System.out.println("DESCRIPTOR cma " + b64.encodeToString(cma.describe(region).pack()));
      System.out.println("DESCRIPTOR tcp " + b64.encodeToString(tcp.describe(region).pack()));
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
          case "READ" -> {
            Transport t = w[1].equals("cma") ? cma : tcp;
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
}
