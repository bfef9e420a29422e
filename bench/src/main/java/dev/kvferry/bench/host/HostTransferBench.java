package dev.kvferry.bench.host;

import dev.kvferry.rdma.MemoryRegion;
import dev.kvferry.rdma.testing.ChildJvm;
import dev.kvferry.rdma.MalformedDescriptorException;
import dev.kvferry.rdma.RegionDescriptor;
import dev.kvferry.rdma.RegionRegistry;
import dev.kvferry.rdma.TransferBatch;
import dev.kvferry.rdma.TransferStatus;
import dev.kvferry.rdma.Transport;
import dev.kvferry.rdma.TransportOptions;
import dev.kvferry.rdma.Transports;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.time.Duration;
import java.util.Arrays;
import java.util.Base64;
import java.util.List;
import java.util.Locale;
import java.util.Random;
import java.util.zip.CRC32C;

/**
 * Host-to-host-process throughput of one transport, the way a KV transfer moves blocks: this JVM
 * holds the source blocks, a child JVM ({@link BenchPeer}) the destination region. Each round
 * writes every block once; the result is the median over rounds, after three warm-up rounds, and
 * the destination is verified by checksum. Layouts follow shared/peers/memcpy_ceiling.c:
 * {@code contiguous} (blocks in order on both sides, so runs merge) and {@code scattered} (a
 * shuffled block order on both sides).
 *
 * <pre>
 * java -cp ... dev.kvferry.bench.host.HostTransferBench BLOCK_BYTES NUM_BLOCKS ROUNDS cma|tcp
 *     contiguous|scattered [--socket-buffer=BYTES] [--cma-inline-max=BYTES]
 * </pre>
 * prints one JSON line.
 */
public final class HostTransferBench {
  private static final Duration REPLY = Duration.ofSeconds(120);
  private static final int WARMUP_ROUNDS = 3;

  /** Block order on both sides. */
  public enum Layout {
    CONTIGUOUS,
    SCATTERED;

    static Layout parse(String s) {
      try {
        return valueOf(s.toUpperCase(Locale.ROOT));
      } catch (IllegalArgumentException e) {
        throw new IllegalArgumentException("layout must be contiguous or scattered, got '" + s + "'");
      }
    }
  }

  /**
   * What to measure.
   *
   * @param socketBufferBytes SO_SNDBUF/SO_RCVBUF for tcp, 0 for the kernel's autotuning
   * @param cmaInlineMaxBytes CMA batches up to this size run in the caller's thread
   */
  public record Config(
      long blockBytes, int blockCount, int rounds, String transport, Layout layout,
      int socketBufferBytes, long cmaInlineMaxBytes) {

    /** Default transport options. */
    public Config(long blockBytes, int blockCount, int rounds, String transport, Layout layout) {
      this(blockBytes, blockCount, rounds, transport, layout, 0,
          TransportOptions.defaults().cmaInlineMaxBytes());
    }

    public Config {
      if (blockBytes <= 0 || blockCount <= 0 || rounds <= 0) {
        throw new IllegalArgumentException("block bytes, block count and rounds must be positive");
      }
      if (!transport.equals("cma") && !transport.equals("tcp")) {
        throw new IllegalArgumentException("transport must be cma or tcp, got '" + transport + "'");
      }
    }

    public long totalBytes() {
      return blockBytes * blockCount;
    }
  }

  /** Median, min and max GB/s (1e9 bytes per second) over the rounds; verified by checksum. */
  public record Result(Config config, double medianGbps, double minGbps, double maxGbps, boolean verified) {
    public String toJson() {
      return String.format(
          Locale.ROOT,
          "{\"transport\": \"%s\", \"layout\": \"%s\", \"block_bytes\": %d, \"num_blocks\": %d, "
              + "\"rounds\": %d, \"gbps\": %.3f, \"min_gbps\": %.3f, \"max_gbps\": %.3f, "
              + "\"verified\": %s}",
          config.transport(), config.layout().name().toLowerCase(Locale.ROOT), config.blockBytes(),
          config.blockCount(), config.rounds(), medianGbps, minGbps, maxGbps, verified);
    }
  }

  private HostTransferBench() {}

  public static void main(String[] args) throws Exception {
    if (args.length < 5) {
      System.err.println(
          "usage: HostTransferBench BLOCK_BYTES NUM_BLOCKS ROUNDS cma|tcp contiguous|scattered "
              + "[--socket-buffer=BYTES] [--cma-inline-max=BYTES]");
      System.exit(2);
    }
    int socketBuffer = 0;
    long cmaInlineMax = TransportOptions.defaults().cmaInlineMaxBytes();
    for (int i = 5; i < args.length; i++) {
      if (args[i].startsWith("--socket-buffer=")) {
        socketBuffer = Integer.parseInt(args[i].substring("--socket-buffer=".length()));
      } else if (args[i].startsWith("--cma-inline-max=")) {
        cmaInlineMax = Long.parseLong(args[i].substring("--cma-inline-max=".length()));
      } else {
        throw new IllegalArgumentException("unknown option " + args[i]);
      }
    }
    Config config =
        new Config(
            Long.parseLong(args[0]), Integer.parseInt(args[1]), Integer.parseInt(args[2]), args[3],
            Layout.parse(args[4]), socketBuffer, cmaInlineMax);
    System.out.println(run(config).toJson());
  }

  /** Runs the measurement with a fresh peer process; for {@code kvferry bench}. */
  public static Result run(Config config) throws IOException {
    long total = config.totalBytes();
    try (ChildJvm peer =
            ChildJvm.start(
                BenchPeer.class.getName(),
                List.of("-Xmx256m"),
                List.of(String.valueOf(total), config.transport(),
                    String.valueOf(config.socketBufferBytes())));
        RegionRegistry registry = new RegionRegistry("bench");
        Transport transport =
            Transports.open(
                config.transport(),
                registry,
                TransportOptions.defaults()
                    .withTcpListener(false)
                    .withTcpSocketBufferBytes(config.socketBufferBytes())
                    .withCmaInlineMaxBytes(config.cmaInlineMaxBytes()))) {
      RegionDescriptor remote = descriptor(peer.awaitLine("DESCRIPTOR ", REPLY));
      MemoryRegion source = registry.allocateHost(total);
      fill(source);
      int n = config.blockCount();
      int[] from = order(n, config.layout(), 42);
      int[] to = order(n, config.layout(), 43);
      long[] lo = new long[n];
      long[] ro = new long[n];
      long[] sz = new long[n];
      for (int i = 0; i < n; i++) {
        lo[i] = from[i] * config.blockBytes();
        ro[i] = to[i] * config.blockBytes();
        sz[i] = config.blockBytes();
      }
      TransferBatch batch = new TransferBatch(lo, ro, sz);

      // Warm-up: connections, JIT of both JVMs (whose compiler threads would otherwise share
      // the cores with the measured rounds).
      for (int w = 0; w < WARMUP_ROUNDS; w++) {
        writeOnce(transport, source, remote, batch);
      }
      boolean verified = verify(peer, source, from, to, config);
      double[] gbps = new double[config.rounds()];
      for (int r = 0; r < config.rounds(); r++) {
        long t0 = System.nanoTime();
        writeOnce(transport, source, remote, batch);
        gbps[r] = total / (double) (System.nanoTime() - t0); // bytes per ns = GB/s
      }
      Arrays.sort(gbps);
      return new Result(config, gbps[gbps.length / 2], gbps[0], gbps[gbps.length - 1], verified);
    }
  }

  private static void writeOnce(
      Transport transport, MemoryRegion source, RegionDescriptor remote, TransferBatch batch)
      throws IOException {
    TransferStatus s = transport.write(source, remote, batch).completion().join();
    if (!s.succeeded()) {
      throw new IOException("bench transfer failed: " + s.failureMessage());
    }
  }

  /** Compares the peer's checksum of its region with the blocks we sent, in its order. */
  private static boolean verify(ChildJvm peer, MemoryRegion source, int[] from, int[] to, Config c)
      throws IOException {
    int[] sourceOf = new int[from.length];
    for (int i = 0; i < from.length; i++) {
      sourceOf[to[i]] = from[i];
    }
    CRC32C expected = new CRC32C();
    for (int d = 0; d < from.length; d++) {
      long offset = sourceOf[d] * c.blockBytes();
      for (long done = 0; done < c.blockBytes(); ) {
        int len = (int) Math.min(1 << 30, c.blockBytes() - done);
        expected.update(source.buffer(offset + done, len));
        done += len;
      }
    }
    String crc = peer.request("CRC 0 " + c.totalBytes(), "CRC ", REPLY);
    return crc.equals(String.valueOf(expected.getValue()));
  }

  private static void fill(MemoryRegion region) {
    for (long done = 0; done < region.lengthBytes(); ) {
      int len = (int) Math.min(1 << 30, region.lengthBytes() - done);
      ByteBuffer b = region.buffer(done, len);
      for (int i = 0; i + 8 <= len; i += 8) {
        b.putLong(i, (done + i) * 0x9E3779B97F4A7C15L);
      }
      done += len;
    }
  }

  private static int[] order(int n, Layout layout, long seed) {
    int[] order = new int[n];
    for (int i = 0; i < n; i++) {
      order[i] = i;
    }
    if (layout == Layout.SCATTERED) {
      Random r = new Random(seed);
      for (int i = n - 1; i > 0; i--) {
        int j = r.nextInt(i + 1);
        int t = order[i];
        order[i] = order[j];
        order[j] = t;
      }
    }
    return order;
  }

  private static RegionDescriptor descriptor(String base64) throws IOException {
    try {
      return RegionDescriptor.unpack(Base64.getDecoder().decode(base64));
    } catch (MalformedDescriptorException | IllegalArgumentException e) {
      throw new IOException("bench peer printed a bad descriptor: " + e.getMessage(), e);
    }
  }
}
