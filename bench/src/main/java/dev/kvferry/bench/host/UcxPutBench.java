package dev.kvferry.bench.host;

import dev.kvferry.rdma.MalformedDescriptorException;
import dev.kvferry.rdma.MemoryRegion;
import dev.kvferry.rdma.RegionDescriptor;
import dev.kvferry.rdma.RegionRegistry;
import dev.kvferry.rdma.TransferBatch;
import dev.kvferry.rdma.TransferStatus;
import dev.kvferry.rdma.TransportOptions;
import dev.kvferry.rdma.UcxTransport;
import dev.kvferry.rdma.testing.ChildJvm;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.time.Duration;
import java.util.Arrays;
import java.util.Base64;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.zip.CRC32C;

/**
 * Put bandwidth of the ucx transport into another process over one UCX transport (UCX_TLS), the
 * figure {@code ucx_perftest -t ucp_put_bw} gives for UCX itself. This JVM holds the source, a
 * child JVM ({@link BenchPeer}, UCX_TLS in its environment) the destination region. One batch is
 * {@code blockCount} puts of {@code blockBytes} and one flush, timed from {@code write} to its
 * status; the figure is the median over rounds after three warm-up batches. Layouts: {@code
 * distinct} (block i of the source to block i of the destination: a KV transfer's bytes, each
 * byte moved once) and {@code repeated} (every put from the same buffer to the same remote
 * offset: ucx_perftest's own pattern, cache-resident on both sides).
 *
 * <pre>
 * java -cp ... dev.kvferry.bench.host.UcxPutBench UCX_TLS BLOCK_BYTES NUM_BLOCKS ROUNDS
 * </pre>
 * prints one JSON line per layout.
 */
public final class UcxPutBench implements AutoCloseable {
  private static final Duration REPLY = Duration.ofSeconds(120);
  private static final int WARMUP_ROUNDS = 3;

  /** Where each put reads and writes. */
  public enum Layout {
    DISTINCT,
    REPEATED
  }

  /** Median, min and max GB/s (1e9 bytes per second) over the rounds. */
  public record Result(String tls, Layout layout, long blockBytes, int blockCount, double medianGbps,
      double minGbps, double maxGbps, boolean verified) {
    public String toJson() {
      return String.format(Locale.ROOT,
          "{\"transport\": \"ucx\", \"ucx_tls\": \"%s\", \"layout\": \"%s\", \"block_bytes\": %d, "
              + "\"num_blocks\": %d, \"gbps\": %.3f, \"min_gbps\": %.3f, \"max_gbps\": %.3f, "
              + "\"verified\": %s}",
          tls, layout.name().toLowerCase(Locale.ROOT), blockBytes, blockCount, medianGbps, minGbps,
          maxGbps, verified);
    }
  }

  private final String tls;
  private final long regionBytes;
  private final ChildJvm peer;
  private final RegionRegistry registry;
  private final UcxTransport transport;
  private final RegionDescriptor remote;
  private final MemoryRegion source;

  /** Starts the peer process and this side's UCX worker, both with {@code UCX_TLS=tls}. */
  public UcxPutBench(String tls, long regionBytes) throws IOException {
    this.tls = tls;
    this.regionBytes = regionBytes;
    this.peer = ChildJvm.start(BenchPeer.class.getName(), List.of("-Xmx256m"),
        List.of(String.valueOf(regionBytes), "ucx", "0"), Map.of("UCX_TLS", tls));
    this.registry = new RegionRegistry("bench");
    try {
      this.transport = new UcxTransport(TransportOptions.defaults().withUcxTransports(tls));
      this.remote = descriptor(peer.awaitLine("DESCRIPTOR ", REPLY));
    } catch (IOException | RuntimeException e) {
      peer.close();
      registry.close();
      throw e;
    }
    this.source = registry.allocateHost(regionBytes);
    fill(source);
  }

  public static void main(String[] args) throws Exception {
    if (args.length < 4) {
      System.err.println("usage: UcxPutBench UCX_TLS BLOCK_BYTES NUM_BLOCKS ROUNDS");
      System.exit(2);
    }
    long block = Long.parseLong(args[1]);
    int count = Integer.parseInt(args[2]);
    try (UcxPutBench bench = new UcxPutBench(args[0], block * count)) {
      for (Layout layout : Layout.values()) {
        System.out.println(bench.run(block, count, Integer.parseInt(args[3]), layout).toJson());
      }
    }
  }

  /** One measurement: {@code rounds} timed batches of {@code blockCount} puts and a flush. */
  public Result run(long blockBytes, int blockCount, int rounds, Layout layout) throws IOException {
    if (blockBytes * blockCount > regionBytes) {
      throw new IllegalArgumentException(blockCount + " blocks of " + blockBytes
          + " bytes exceed the region of " + regionBytes);
    }
    long[] offsets = new long[blockCount];
    long[] sizes = new long[blockCount];
    for (int i = 0; i < blockCount; i++) {
      offsets[i] = layout == Layout.DISTINCT ? i * blockBytes : 0;
      sizes[i] = blockBytes;
    }
    TransferBatch batch = new TransferBatch(offsets, offsets.clone(), sizes);
    long total = blockBytes * blockCount;
    for (int w = 0; w < WARMUP_ROUNDS; w++) {
      writeOnce(batch);
    }
    long checked = layout == Layout.DISTINCT ? total : blockBytes;
    CRC32C expected = new CRC32C();
    expected.update(source.buffer(0, (int) checked));
    boolean verified =
        peer.request("CRC 0 " + checked, "CRC ", REPLY).equals(String.valueOf(expected.getValue()));
    double[] gbps = new double[rounds];
    for (int r = 0; r < rounds; r++) {
      long t0 = System.nanoTime();
      writeOnce(batch);
      gbps[r] = total / (double) (System.nanoTime() - t0); // bytes per ns = GB/s
    }
    Arrays.sort(gbps);
    return new Result(tls, layout, blockBytes, blockCount, gbps[rounds / 2], gbps[0],
        gbps[rounds - 1], verified);
  }

  private void writeOnce(TransferBatch batch) throws IOException {
    TransferStatus s = transport.write(source, remote, batch).completion().join();
    if (!s.succeeded()) {
      throw new IOException("ucx bench transfer failed: " + s.failureMessage());
    }
  }

  @Override
  public void close() {
    try {
      peer.close();
    } finally {
      transport.close();
      registry.close();
    }
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

  private static RegionDescriptor descriptor(String base64) throws IOException {
    try {
      return RegionDescriptor.unpack(Base64.getDecoder().decode(base64));
    } catch (MalformedDescriptorException | IllegalArgumentException e) {
      throw new IOException("bench peer printed a bad descriptor: " + e.getMessage(), e);
    }
  }
}
