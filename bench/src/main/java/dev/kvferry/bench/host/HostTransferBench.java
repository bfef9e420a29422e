package dev.kvferry.bench.host;

import dev.kvferry.rdma.CmaTransport;
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
 * writes every block once; the result is the median over rounds, after a warm-up of at least three
 * rounds and {@link #WARMUP_NANOS}. The peer zeroes its region after the warm-up, and after the
 * timed rounds the destination is verified by checksum (every block where it belongs, every other
 * block still zero), so the figure is of rounds that moved the right bytes. Layouts: {@code
 * contiguous} (blocks in order on both sides, so runs merge) and {@code scattered} (on each side
 * n distinct random block ids out of a pool of 2n, as an allocator in use hands them out, so
 * sorting by address merges few runs).
 *
 * <pre>
 * java -cp ... dev.kvferry.bench.host.HostTransferBench BLOCK_BYTES NUM_BLOCKS ROUNDS cma|tcp
 *     contiguous|scattered [--socket-buffer=BYTES] [--cma-inline-max=BYTES] [--tcp-streams=N]
 *     [--cma-syscalls] [--destination-slots=N] [--rewrite-source]
 * </pre>
 * prints one JSON line.
 */
public final class HostTransferBench {
  private static final Duration REPLY = Duration.ofSeconds(120);
  private static final int WARMUP_ROUNDS = 3;

  /**
   * The warm-up also lasts at least this long ({@code -Dkvferry.bench.warmup-ms=N} for an A/B).
   * Three rounds of a 64 MiB batch (512 tokens) took some 15 ms, too few for the JIT to compile
   * the per-batch Java work, and the timed rounds then measured partly interpreted code: cma
   * contiguous 512 tok median 11.87 / 12.35 / 12.26 GB/s after three rounds against 13.71 /
   * 14.79 / 12.47 after 500 ms, the slowest rounds 8.40 / 8.72 / 9.34 against 12.47 / 12.65 /
   * 10.01 (docs/results/2026-12-02-host-warmup-ab.txt). A node does this work thousands of times;
   * the C peers have no JIT to warm.
   */
  static final long WARMUP_NANOS = Long.getLong("kvferry.bench.warmup-ms", 500) * 1_000_000;

  /** How block ids are chosen on both sides. */
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
   * Threads a large mapped cma copy is shared by ({@link TransportOptions#withCmaCopyThreads}):
   * the transport's default, or {@code -Dkvferry.bench.cma-copy-threads=N} for an A/B.
   */
  public static final int CMA_COPY_THREADS = Integer.getInteger(
      "kvferry.bench.cma-copy-threads", TransportOptions.defaults().cmaCopyThreads());

  /**
   * What to measure.
   *
   * @param socketBufferBytes SO_SNDBUF/SO_RCVBUF for tcp, 0 for the kernel's autotuning
   * @param cmaInlineMaxBytes CMA batches up to this size run in the caller's thread
   * @param tcpStreams connections a tcp batch is striped over ({@link
   *     TransportOptions#withTcpStreams})
   * @param cmaMapPeerPages cma copies through a mapping of the peer's pages (the default), else
   *     with process_vm_writev ({@link TransportOptions#withCmaMapPeerPages})
   * @param cmaCopyThreads threads a large mapped cma copy is shared by ({@link
   *     TransportOptions#withCmaCopyThreads})
   * @param destinationSlots copies of D's pool side by side; round r writes into slot r mod
   *     slots, so with enough slots (together larger than the last-level cache) no round finds
   *     its destination in cache, as a transfer meets D's memory; 1: every round writes the same
   *     destination blocks
   * @param rewriteSource before each round another thread writes the blocks the round copies
   *     again (the same bytes, untimed), as an engine has just computed the layer it hands over:
   *     the round then copies lines that are dirty, some in another core's cache
   */
  public record Config(
      long blockBytes, int blockCount, int rounds, String transport, Layout layout,
      int socketBufferBytes, long cmaInlineMaxBytes, int tcpStreams, boolean cmaMapPeerPages,
      int cmaCopyThreads, int destinationSlots, boolean rewriteSource) {

    /** Default transport options (the copy threads: {@link #CMA_COPY_THREADS}). */
    public Config(long blockBytes, int blockCount, int rounds, String transport, Layout layout) {
      this(blockBytes, blockCount, rounds, transport, layout, 0,
          TransportOptions.defaults().cmaInlineMaxBytes(), 1, true, CMA_COPY_THREADS, 1, false);
    }

    /** The same but the tcp streams. */
    public Config withTcpStreams(int streams) {
      return new Config(blockBytes, blockCount, rounds, transport, layout, socketBufferBytes,
          cmaInlineMaxBytes, streams, cmaMapPeerPages, cmaCopyThreads, destinationSlots,
          rewriteSource);
    }

    /** The same but whether cma maps the peer's pages. */
    public Config withCmaMapPeerPages(boolean map) {
      return new Config(blockBytes, blockCount, rounds, transport, layout, socketBufferBytes,
          cmaInlineMaxBytes, tcpStreams, map, cmaCopyThreads, destinationSlots,
          rewriteSource);
    }

    /** The same but the threads a large mapped cma copy is shared by. */
    public Config withCmaCopyThreads(int threads) {
      return new Config(blockBytes, blockCount, rounds, transport, layout, socketBufferBytes,
          cmaInlineMaxBytes, tcpStreams, cmaMapPeerPages, threads, destinationSlots,
          rewriteSource);
    }

    /** The same but writing round r into destination slot r mod {@code slots}. */
    public Config withDestinationSlots(int slots) {
      return new Config(blockBytes, blockCount, rounds, transport, layout, socketBufferBytes,
          cmaInlineMaxBytes, tcpStreams, cmaMapPeerPages, cmaCopyThreads, slots, rewriteSource);
    }

    /** The same but with the source written again by another thread before each round. */
    public Config withRewrittenSource(boolean rewrite) {
      return new Config(blockBytes, blockCount, rounds, transport, layout, socketBufferBytes,
          cmaInlineMaxBytes, tcpStreams, cmaMapPeerPages, cmaCopyThreads, destinationSlots,
          rewrite);
    }

    public Config {
      if (blockBytes <= 0 || blockCount <= 0 || rounds <= 0) {
        throw new IllegalArgumentException("block bytes, block count and rounds must be positive");
      }
      if (destinationSlots < 1 || destinationSlots > rounds) {
        throw new IllegalArgumentException("destination slots must be 1.." + rounds
            + " (every slot written in the timed rounds), got " + destinationSlots);
      }
      if (!transport.equals("cma") && !transport.equals("tcp")) {
        throw new IllegalArgumentException("transport must be cma or tcp, got '" + transport + "'");
      }
    }

    public long totalBytes() {
      return blockBytes * blockCount;
    }

    /** Blocks in each side's region: the transfer's own, or twice that when scattered. */
    public int poolBlocks() {
      return layout == Layout.SCATTERED ? 2 * blockCount : blockCount;
    }

    public long regionBytes() {
      return blockBytes * poolBlocks();
    }
  }

  /**
   * Median, min and max GB/s (1e9 bytes per second) over the timed rounds.
   *
   * @param verified whether D's region held exactly the expected bytes after the timed rounds
   * @param sourceRuns runs of adjacent blocks on P's side once entries are sorted by P's address
   * @param destinationRuns the same on D's side: what a transport that merges runs can merge
   * @param copyPath how the bytes moved: cma {@code mapped} (memcpy through a mapping of the
   *     peer's pages) or {@code syscalls} (process_vm_writev); tcp {@code tcp}
   */
  public record Result(Config config, double medianGbps, double minGbps, double maxGbps,
      boolean verified, int sourceRuns, int destinationRuns, String copyPath) {
    public String toJson() {
      return String.format(
          Locale.ROOT,
          "{\"transport\": \"%s\", \"layout\": \"%s\", \"block_bytes\": %d, \"num_blocks\": %d, "
              + "\"pool_blocks\": %d, \"source_runs\": %d, \"destination_runs\": %d, "
              + "\"rounds\": %d, \"gbps\": %.3f, \"min_gbps\": %.3f, \"max_gbps\": %.3f, "
              + "\"verified\": %s, \"copy_path\": \"%s\"}",
          config.transport(), config.layout().name().toLowerCase(Locale.ROOT), config.blockBytes(),
          config.blockCount(), config.poolBlocks(), sourceRuns, destinationRuns, config.rounds(),
          medianGbps, minGbps, maxGbps, verified, copyPath);
    }
  }

  private HostTransferBench() {}

  public static void main(String[] args) throws Exception {
    if (args.length < 5) {
      System.err.println(
          "usage: HostTransferBench BLOCK_BYTES NUM_BLOCKS ROUNDS cma|tcp contiguous|scattered "
              + "[--socket-buffer=BYTES] [--cma-inline-max=BYTES] [--tcp-streams=N] "
              + "[--cma-syscalls] [--destination-slots=N] [--rewrite-source]");
      System.exit(2);
    }
    int socketBuffer = 0;
    long cmaInlineMax = TransportOptions.defaults().cmaInlineMaxBytes();
    int streams = 1;
    boolean mapPeerPages = true;
    int slots = 1;
    boolean rewrite = false;
    for (int i = 5; i < args.length; i++) {
      if (args[i].startsWith("--socket-buffer=")) {
        socketBuffer = Integer.parseInt(args[i].substring("--socket-buffer=".length()));
      } else if (args[i].startsWith("--cma-inline-max=")) {
        cmaInlineMax = Long.parseLong(args[i].substring("--cma-inline-max=".length()));
      } else if (args[i].startsWith("--tcp-streams=")) {
        streams = Integer.parseInt(args[i].substring("--tcp-streams=".length()));
      } else if (args[i].equals("--cma-syscalls")) {
        mapPeerPages = false;
      } else if (args[i].equals("--rewrite-source")) {
        rewrite = true;
      } else if (args[i].startsWith("--destination-slots=")) {
        slots = Integer.parseInt(args[i].substring("--destination-slots=".length()));
      } else {
        throw new IllegalArgumentException("unknown option " + args[i]);
      }
    }
    Config config =
        new Config(
            Long.parseLong(args[0]), Integer.parseInt(args[1]), Integer.parseInt(args[2]), args[3],
            Layout.parse(args[4]), socketBuffer, cmaInlineMax, streams, mapPeerPages,
            CMA_COPY_THREADS, slots, rewrite);
    System.out.println(run(config).toJson());
  }

  /** Runs the measurement with a fresh peer process; for {@code kvferry bench}. */
  public static Result run(Config config) throws IOException {
    long total = config.totalBytes();
    try (ChildJvm peer =
            ChildJvm.start(
                BenchPeer.class.getName(),
                List.of("-Xmx256m"),
                List.of(String.valueOf(config.regionBytes() * config.destinationSlots()),
                    config.transport(),
                    String.valueOf(config.socketBufferBytes())));
        RegionRegistry registry = new RegionRegistry("bench");
        Transport transport =
            Transports.open(
                config.transport(),
                registry,
                TransportOptions.defaults()
                    .withTcpListener(false)
                    .withTcpSocketBufferBytes(config.socketBufferBytes())
                    .withCmaInlineMaxBytes(config.cmaInlineMaxBytes())
                    .withTcpStreams(config.tcpStreams())
                    .withCmaMapPeerPages(config.cmaMapPeerPages())
                    .withCmaCopyThreads(config.cmaCopyThreads())
                    .withIoThreads(
                        Math.max(Math.max(2, config.cmaCopyThreads()), config.tcpStreams())))) {
      RegionDescriptor remote = descriptor(peer.awaitLine("DESCRIPTOR ", REPLY));
      MemoryRegion source = registry.allocateHost(config.regionBytes());
      fill(source);
      int n = config.blockCount();
      int[] from = blockIds(n, config.poolBlocks(), config.layout(), 42);
      int[] to = blockIds(n, config.poolBlocks(), config.layout(), 43);
      long[] lo = new long[n];
      long[] ro = new long[n];
      long[] sz = new long[n];
      for (int i = 0; i < n; i++) {
        lo[i] = from[i] * config.blockBytes();
        ro[i] = to[i] * config.blockBytes();
        sz[i] = config.blockBytes();
      }
      TransferBatch[] batches = new TransferBatch[config.destinationSlots()];
      for (int slot = 0; slot < batches.length; slot++) {
        long[] shifted = new long[n];
        for (int i = 0; i < n; i++) {
          shifted[i] = ro[i] + slot * config.regionBytes();
        }
        batches[slot] = new TransferBatch(lo, shifted, sz);
      }

      // Warm-up: connections, JIT of both JVMs (whose compiler threads would otherwise share
      // the cores with the measured rounds).
      long warmStart = System.nanoTime();
      for (int w = 0; w < WARMUP_ROUNDS || System.nanoTime() - warmStart < WARMUP_NANOS; w++) {
        writeOnce(transport, source, remote, batches[w % batches.length]);
      }
      // The warm-up's bytes must not count for the timed rounds' check.
      peer.request("ZERO", "ZEROED", REPLY);
      double[] gbps = new double[config.rounds()];
      for (int r = 0; r < config.rounds(); r++) {
        TransferBatch batch = batches[r % batches.length];
        if (config.rewriteSource()) {
          rewrite(source, from, config.blockBytes());
        }
        long t0 = System.nanoTime();
        writeOnce(transport, source, remote, batch);
        gbps[r] = total / (double) (System.nanoTime() - t0); // bytes per ns = GB/s
      }
      boolean verified = verify(peer, source, from, to, config);
      Arrays.sort(gbps);
      String path = transport instanceof CmaTransport cma
          ? (cma.peerRegionsMappedTotal() == 0 ? "syscalls"
              : cma.sharedCopies() > 0 ? "mapped, each batch shared by "
                  + config.cmaCopyThreads() + " threads" : "mapped, one thread")
          : config.transport();
      return new Result(config, gbps[gbps.length / 2], gbps[0], gbps[gbps.length - 1], verified,
          runs(from), runs(to), path);
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

  /**
   * Compares the peer's checksum of its whole region with what it must hold: block {@code to[i]}
   * equal to our block {@code from[i]}, every block no entry names still zero.
   */
  private static boolean verify(ChildJvm peer, MemoryRegion source, int[] from, int[] to, Config c)
      throws IOException {
    int[] sourceOf = new int[c.poolBlocks()];
    Arrays.fill(sourceOf, -1);
    for (int i = 0; i < from.length; i++) {
      sourceOf[to[i]] = from[i];
    }
    CRC32C expected = new CRC32C();
    ByteBuffer zeros = ByteBuffer.allocateDirect((int) Math.min(1 << 20, c.blockBytes()));
    // Every slot was written by the timed rounds (slots <= rounds): each holds the same blocks.
    for (int slot = 0; slot < c.destinationSlots(); slot++) {
      for (int d = 0; d < sourceOf.length; d++) {
        for (long done = 0; done < c.blockBytes(); ) {
          int len = (int) Math.min(sourceOf[d] < 0 ? zeros.capacity() : 1 << 30,
              c.blockBytes() - done);
          if (sourceOf[d] < 0) {
            expected.update(zeros.duplicate().limit(len));
          } else {
            expected.update(source.buffer(sourceOf[d] * c.blockBytes() + done, len));
          }
          done += len;
        }
      }
    }
    String crc = peer.request("CRC 0 " + c.regionBytes() * c.destinationSlots(), "CRC ", REPLY);
    return crc.equals(String.valueOf(expected.getValue()));
  }

  /** Runs of consecutive ids once sorted: 1 for a contiguous list, about n for a scattered one. */
  static int runs(int[] ids) {
    int[] sorted = ids.clone();
    Arrays.sort(sorted);
    int runs = sorted.length == 0 ? 0 : 1;
    for (int i = 1; i < sorted.length; i++) {
      if (sorted[i] != sorted[i - 1] + 1) {
        runs++;
      }
    }
    return runs;
  }

  /** Writes the blocks the batch copies again, the same bytes, on another thread. */
  private static void rewrite(MemoryRegion source, int[] blocks, long blockBytes) {
    Thread t = new Thread(() -> {
      for (int b : blocks) {
        fill(source, b * blockBytes, blockBytes);
      }
    }, "bench-source-writer");
    t.start();
    try {
      t.join();
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw new IllegalStateException("interrupted while rewriting the source", e);
    }
  }

  private static void fill(MemoryRegion region) {
    fill(region, 0, region.lengthBytes());
  }

  /** The pattern of {@link #fill(MemoryRegion)} over {@code length} bytes from {@code offset}. */
  private static void fill(MemoryRegion region, long offset, long length) {
    for (long done = 0; done < length; ) {
      int len = (int) Math.min(1 << 30, length - done);
      ByteBuffer b = region.buffer(offset + done, len);
      long at = offset + done;
      for (int i = 0; i + 8 <= len; i += 8) {
        b.putLong(i, (at + i) * 0x9E3779B97F4A7C15L);
      }
      done += len;
    }
  }

  /**
   * {@code n} block ids below {@code pool}: in order for contiguous, else {@code n} distinct random
   * ids (a partial Fisher-Yates) in random order.
   */
  static int[] blockIds(int n, int pool, Layout layout, long seed) {
    int[] all = new int[pool];
    for (int i = 0; i < pool; i++) {
      all[i] = i;
    }
    if (layout == Layout.SCATTERED) {
      Random r = new Random(seed);
      for (int i = 0; i < n; i++) {
        int j = i + r.nextInt(pool - i);
        int t = all[i];
        all[i] = all[j];
        all[j] = t;
      }
    }
    return Arrays.copyOf(all, n);
  }

  private static RegionDescriptor descriptor(String base64) throws IOException {
    try {
      return RegionDescriptor.unpack(Base64.getDecoder().decode(base64));
    } catch (MalformedDescriptorException | IllegalArgumentException e) {
      throw new IOException("bench peer printed a bad descriptor: " + e.getMessage(), e);
    }
  }
}
