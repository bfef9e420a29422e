package dev.kvferry.bench.host;

import dev.kvferry.rdma.MemoryRegion;
import dev.kvferry.rdma.RegionRegistry;
import dev.kvferry.rdma.Transport;
import dev.kvferry.rdma.TransportOptions;
import dev.kvferry.rdma.Transports;
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.util.Base64;
import java.util.zip.CRC32C;

/**
 * The destination process of {@link HostTransferBench}: registers a zeroed (so touched) host region,
 * serves it through the named transport, prints {@code DESCRIPTOR <base64>} and answers {@code CRC
 * offset length} and {@code ZERO} (zeroes the whole region) until stdin closes.
 *
 * <p>Arguments: region bytes, transport name, socket buffer bytes (0 = kernel default).
 */
public final class BenchPeer {
  private BenchPeer() {}

  public static void main(String[] args) throws Exception {
    long regionBytes = Long.parseLong(args[0]);
    String transportName = args[1];
    int socketBuffer = args.length > 2 ? Integer.parseInt(args[2]) : 0;
    try (RegionRegistry registry = new RegionRegistry("bench-peer");
        Transport transport =
            Transports.open(
                transportName,
                registry,
                TransportOptions.defaults().withTcpSocketBufferBytes(socketBuffer))) {
      MemoryRegion region = transport.allocateHost(registry, regionBytes);
      System.out.println(
          "DESCRIPTOR " + Base64.getEncoder().encodeToString(transport.describe(region).pack()));
      System.out.flush();
      BufferedReader in =
          new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
      String line;
      while ((line = in.readLine()) != null) {
        String[] w = line.trim().split(" ");
        if (w[0].equals("CRC")) {
          long offset = Long.parseLong(w[1]);
          long length = Long.parseLong(w[2]);
          CRC32C crc = new CRC32C();
          for (long done = 0; done < length; ) {
            int n = (int) Math.min(1 << 30, length - done);
            crc.update(region.buffer(offset + done, n));
            done += n;
          }
          System.out.println("CRC " + crc.getValue());
        } else if (w[0].equals("ZERO")) {
          for (long done = 0; done < region.lengthBytes(); ) {
            int n = (int) Math.min(1 << 30, region.lengthBytes() - done);
            ByteBuffer b = region.buffer(done, n);
            for (int i = 0; i + 8 <= n; i += 8) {
              b.putLong(i, 0L);
            }
            for (int i = n & ~7; i < n; i++) {
              b.put(i, (byte) 0);
            }
            done += n;
          }
          System.out.println("ZEROED");
        } else {
          System.out.println("UNKNOWN " + line);
        }
        System.out.flush();
      }
    }
  }
}
