package dev.kvferry.bench.gpu;

import com.sun.jna.Memory;
import dev.kvferry.rdma.RegionDescriptor;
import dev.kvferry.rdma.RegionRegistry;
import dev.kvferry.rdma.TcpTransport;
import dev.kvferry.rdma.TransferBatch;
import dev.kvferry.rdma.TransferStatus;
import dev.kvferry.rdma.TransportOptions;
import dev.kvferry.rdma.cuda.Cuda;
import dev.kvferry.rdma.testing.TcpGpuChecks;
import dev.kvferry.rdma.testing.TcpGpuChecks.Side;
import dev.kvferry.rdma.testing.TcpGpuChecks.Where;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.SplittableRandom;

/**
 * Throughput of the tcp transport for GPU memory over loopback, beside its own peer measured in
 * the same run: the same batch host -> host over the same tcp path. GPU -> GPU goes through
 * pinned staging on both ends (P stages device -> host, D host -> device), once per staging depth
 * so the effect of double buffering shows (depth 1: copies and socket I/O take turns). Both
 * layouts a KV transfer has: one contiguous run, and scattered 32 KiB blocks (on each side
 * {@code --blocks} distinct random block ids out of a pool of twice as many, as an allocator in use
 * hands them out, so few neighbours merge). WRITE (P pushes) and READ (P pulls). After each row's
 * passes the destination is read back and checked byte for byte. P and D are two transports in this JVM.
 *
 * <p>Usage: {@code TcpGpuBench [--p-gpu 0] [--d-gpu 0] [--blocks 16384] [--block-bytes 32768]
 * [--reps 5] [--depths 1,2] [--buffer-bytes 4194304]}. GB/s = bytes / wall time of one batch from
 * submit to its status; the median of {@code --reps} passes after one warm-up pass.
 */
public final class TcpGpuBench {

  private TcpGpuBench() {}

  public static void main(String[] args) throws Exception {
    Map<String, String> o = TcpGpuChecks.options(args);
    int pGpu = Integer.parseInt(o.getOrDefault("p-gpu", "0"));
    int dGpu = Integer.parseInt(o.getOrDefault("d-gpu", "0"));
    int blocks = Integer.parseInt(o.getOrDefault("blocks", "16384"));
    long blockBytes = Long.parseLong(o.getOrDefault("block-bytes", "32768"));
    int reps = Integer.parseInt(o.getOrDefault("reps", "5"));
    int[] depths =
        Arrays.stream(o.getOrDefault("depths", "1,2").split(",")).mapToInt(Integer::parseInt).toArray();
    int bufferBytes = Integer.parseInt(o.getOrDefault("buffer-bytes", String.valueOf(4 << 20)));
    if (!Cuda.available()) {
      System.out.println("SKIP tcp GPU bench: CUDA not available: " + Cuda.unavailableReason());
      System.exit(2);
    }
    long bytes = blocks * blockBytes;
    // Each side's region holds a pool of twice the blocks moved, for the scattered layout.
    long regionBytes = 2 * bytes;
    if (bytes <= 0 || regionBytes > Integer.MAX_VALUE) {
      throw new IllegalArgumentException(
          "2 x --blocks x --block-bytes must be 1 byte to 2 GiB (the check reads the region back"
              + " whole), got " + regionBytes);
    }
    System.out.printf(
        Locale.ROOT,
        "tcp over loopback, one JVM: P on GPU %d (%s), D on GPU %d (%s); %d MiB per batch "
            + "(%d blocks of %d B out of twice as many when scattered); median of %d; staging"
            + " buffers of %d B%n",
        pGpu, Cuda.deviceName(pGpu), dGpu, Cuda.deviceName(dGpu), bytes >> 20, blocks, blockBytes,
        reps, bufferBytes);
    StringBuilder header =
        new StringBuilder(String.format(Locale.ROOT, "%-11s %-6s %12s", "layout", "op", "host->host"));
    for (int d : depths) {
      header.append(String.format(Locale.ROOT, " %22s", "gpu->gpu, " + d + " buffer" + (d == 1 ? "" : "s")));
    }
    System.out.println(header);

    List<String> json = new ArrayList<>();
    try (RegionRegistry p = new RegionRegistry("P0");
        RegionRegistry d = new RegionRegistry("D0");
        Side pHost = Side.of(Where.HOST, p, -1, regionBytes);
        Side dHost = Side.of(Where.HOST, d, -1, regionBytes);
        Side pGpuSide = Side.of(Where.GPU, p, pGpu, regionBytes);
        Side dGpuSide = Side.of(Where.GPU, d, dGpu, regionBytes);
        Memory image = TcpGpuChecks.randomImage(regionBytes, 42);
        Memory zeros = TcpGpuChecks.constantImage(regionBytes, (byte) 0);
        Memory expected = new Memory(regionBytes);
        Memory back = new Memory(regionBytes)) {
      for (boolean scattered : new boolean[] {false, true}) {
        long[][] plan = plan(scattered, blocks, blockBytes);
        expected.setMemory(0, regionBytes, (byte) 0);
        TcpGpuChecks.apply(image, expected, plan[0], plan[1], plan[2]);
        for (boolean write : new boolean[] {true, false}) {
          String layout = scattered ? "scattered" : "contiguous";
          String op = write ? "WRITE" : "READ";
          Row row = new Row(write, plan, image, zeros, expected, back, reps, bytes, regionBytes);
          double host = row.measure(TransportOptions.defaults(), pHost, dHost);
          StringBuilder line = new StringBuilder(String.format(Locale.ROOT, "%-11s %-6s %7.2f GB/s", layout, op, host));
          StringBuilder js = new StringBuilder(String.format(Locale.ROOT,
              "{\"layout\":\"%s\",\"op\":\"%s\",\"bytes\":%d,\"host_gbps\":%.3f", layout, op, bytes, host));
          for (int depth : depths) {
            double gpu =
                row.measure(TransportOptions.defaults().withTcpStaging(depth, bufferBytes), pGpuSide, dGpuSide);
            line.append(String.format(Locale.ROOT, " %9.2f GB/s (%.2fx)", gpu, gpu / host));
            js.append(String.format(Locale.ROOT, ",\"gpu_depth%d_gbps\":%.3f", depth, gpu));
          }
          System.out.println(line);
          json.add(js.append('}').toString());
        }
      }
    }
    System.out.println("every destination checked byte for byte after its passes");
    System.out.println("json: [" + String.join(",", json) + "]");
    System.exit(0);
  }

  /**
   * {source offsets, destination offsets, sizes}: one run, or on each side {@code blocks} distinct
   * random ids out of a pool of {@code 2 * blocks}, in random order.
   */
  private static long[][] plan(boolean scattered, int blocks, long blockBytes) {
    if (!scattered) {
      return new long[][] {{0}, {0}, {blocks * blockBytes}};
    }
    SplittableRandom random = new SplittableRandom(7);
    long[] s = new long[blocks];
    long[] d = new long[blocks];
    long[] n = new long[blocks];
    int[] from = pick(blocks, 2 * blocks, random);
    int[] to = pick(blocks, 2 * blocks, random);
    for (int i = 0; i < blocks; i++) {
      s[i] = from[i] * blockBytes;
      d[i] = to[i] * blockBytes;
      n[i] = blockBytes;
    }
    return new long[][] {s, d, n};
  }

  /** {@code n} distinct ids below {@code pool} in random order (a partial Fisher-Yates). */
  private static int[] pick(int n, int pool, SplittableRandom random) {
    int[] a = new int[pool];
    for (int i = 0; i < pool; i++) {
      a[i] = i;
    }
    for (int i = 0; i < n; i++) {
      int j = i + random.nextInt(pool - i);
      int t = a[i];
      a[i] = a[j];
      a[j] = t;
    }
    return Arrays.copyOf(a, n);
  }

  /** One row's batch, timed over one pair of transports and checked afterwards. */
  private record Row(
      boolean write, long[][] plan, Memory image, Memory zeros, Memory expected, Memory back,
      int reps, long bytes, long regionBytes) {

    /** Median GB/s of the batch between P's side {@code p} and D's side {@code d}. */
    double measure(TransportOptions options, Side p, Side d) throws Exception {
      Side src = write ? p : d;
      Side dst = write ? d : p;
      src.load(image);
      dst.load(zeros);
      TransferBatch batch =
          write ? new TransferBatch(plan[0], plan[1], plan[2])
              : new TransferBatch(plan[1], plan[0], plan[2]);
      long[] ns = new long[reps];
      try (TcpTransport client = new TcpTransport(p.region.registry(), options.withTcpListener(false));
          TcpTransport server = new TcpTransport(d.region.registry(), options)) {
        RegionDescriptor remote = server.describe(d.region);
        for (int i = -1; i < reps; i++) {
          long start = System.nanoTime();
          TransferStatus s = write ? client.write(p.region, remote, batch) : client.read(p.region, remote, batch);
          TcpGpuChecks.await(s);
          long elapsed = System.nanoTime() - start;
          TcpGpuChecks.check(s.succeeded(), "transfer failed: " + s);
          if (i >= 0) {
            ns[i] = elapsed;
          }
        }
      }
      dst.readInto(back);
      TcpGpuChecks.compare(expected, back, regionBytes, "destination");
      Arrays.sort(ns);
      return bytes / (double) ns[reps / 2];
    }
  }
}
