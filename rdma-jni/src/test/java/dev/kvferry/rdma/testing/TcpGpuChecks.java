package dev.kvferry.rdma.testing;

import com.sun.jna.Memory;
import com.sun.jna.Pointer;
import dev.kvferry.rdma.MemoryRegion;
import dev.kvferry.rdma.RegionDescriptor;
import dev.kvferry.rdma.RegionKind;
import dev.kvferry.rdma.RegionRegistry;
import dev.kvferry.rdma.TcpTransport;
import dev.kvferry.rdma.TransferBatch;
import dev.kvferry.rdma.TransferStatus;
import dev.kvferry.rdma.TransportOptions;
import dev.kvferry.rdma.cuda.Cuda;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.LongBuffer;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.SplittableRandom;
import java.util.concurrent.TimeUnit;

/**
 * The tcp transport moving GPU memory over loopback, staged through pinned host buffers: P (the
 * client, on {@code --p-gpu}) and D (the listener, on {@code --d-gpu}) move bytes GPU to GPU, GPU
 * to host and host to GPU, contiguous and as 4096 scattered 32 KiB blocks, WRITE and READ; every
 * byte of the destination region is read back and compared with what must be there (the moved
 * bytes, and guard bytes everywhere else). Out-of-bounds entries against a GPU region must fail
 * before any byte moves.
 *
 * <p>For GPU hosts without JUnit: {@code TcpGpuChecks [--p-gpu 0] [--d-gpu 0]} prints PASS or FAIL
 * per case and exits 0 when all passed, 1 when one failed, 2 without CUDA. The JUnit test {@code
 * TcpStagingGpuTest} runs the same cases.
 */
public final class TcpGpuChecks {
  public static final long BLOCK_BYTES = 32 * 1024;
  public static final int BLOCKS = 4096;
  /** Region capacity in blocks: more than the batch moves, so some blocks must stay guard. */
  public static final int CAPACITY_BLOCKS = BLOCKS + 64;
  private static final byte GUARD = (byte) 0xA5;
  private static final long WAIT_SECONDS = 120;

  private TcpGpuChecks() {}

  /** One case: a name saying what must hold, and a body that throws when it does not. */
  public record Check(String name, Body body) {}

  /** A case's body. */
  @FunctionalInterface
  public interface Body {
    void run() throws Exception;
  }

  /** Where a region's bytes live. */
  public enum Where {
    GPU,
    HOST;

    String label() {
      return this == GPU ? "gpu" : "host";
    }
  }

  /** How the batch's entries lie in the two regions. */
  public enum Layout {
    /** One entry of about 128 MiB, at odd offsets, not a multiple of any buffer size. */
    CONTIGUOUS,
    /** 4096 entries of 32 KiB, each block to a random block of the other side. */
    SCATTERED,
    /** 1500 entries of 1 byte to 100 KiB, some adjacent, shuffled between the sides. */
    ODD
  }

  /** Every case, P on {@code pGpu} and D on {@code dGpu}. */
  public static List<Check> checks(int pGpu, int dGpu) {
    List<Check> checks = new ArrayList<>();
    TransportOptions defaults = TransportOptions.defaults();
    Where[][] pairs = {{Where.GPU, Where.GPU}, {Where.GPU, Where.HOST}, {Where.HOST, Where.GPU}};
    for (boolean write : new boolean[] {true, false}) {
      for (Where[] pair : pairs) {
        for (Layout layout : new Layout[] {Layout.CONTIGUOUS, Layout.SCATTERED}) {
          checks.add(
              new Check(
                  moveName(write, pair[0], pair[1], layout, defaults),
                  () -> move(pGpu, dGpu, pair[0], pair[1], layout, write, defaults)));
        }
      }
    }
    TransportOptions odd = defaults.withTcpStaging(3, (1 << 20) + 4096);
    TransportOptions single = defaults.withTcpStaging(1, 4 << 20);
    for (boolean write : new boolean[] {true, false}) {
      checks.add(
          new Check(
              moveName(write, Where.GPU, Where.GPU, Layout.ODD, odd),
              () -> move(pGpu, dGpu, Where.GPU, Where.GPU, Layout.ODD, write, odd)));
      checks.add(
          new Check(
              moveName(write, Where.GPU, Where.GPU, Layout.SCATTERED, single),
              () -> move(pGpu, dGpu, Where.GPU, Where.GPU, Layout.SCATTERED, write, single)));
    }
    checks.add(
        new Check(
            "out-of-bounds entry of P's GPU region: refused before any byte moves",
            () -> outOfBoundsLocally(pGpu, dGpu)));
    checks.add(
        new Check(
            "out-of-bounds entry of D's GPU region (lying descriptor): the listener refuses before "
                + "any byte moves and keeps serving",
            () -> outOfBoundsAtTheListener(pGpu, dGpu)));
    return checks;
  }

  public static void main(String[] args) {
    Map<String, String> o = options(args);
    int pGpu = Integer.parseInt(o.getOrDefault("p-gpu", "0"));
    int dGpu = Integer.parseInt(o.getOrDefault("d-gpu", "0"));
    if (!Cuda.available()) {
      System.out.println("SKIP tcp GPU checks: CUDA not available: " + Cuda.unavailableReason());
      System.exit(2);
    }
    System.out.printf(
        Locale.ROOT, "tcp GPU checks: P on GPU %d (%s), D on GPU %d (%s), loopback%n",
        pGpu, Cuda.deviceName(pGpu), dGpu, Cuda.deviceName(dGpu));
    List<Check> checks = checks(pGpu, dGpu);
    int failed = 0;
    for (Check c : checks) {
      long start = System.nanoTime();
      try {
        c.body().run();
        System.out.printf(
            Locale.ROOT, "PASS  %s (%d ms)%n", c.name(),
            TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - start));
      } catch (Throwable t) {
        failed++;
        System.out.printf(Locale.ROOT, "FAIL  %s: %s%n", c.name(), t);
        t.printStackTrace(System.out);
      }
    }
    System.out.printf(Locale.ROOT, "%d of %d passed%n", checks.size() - failed, checks.size());
    System.exit(failed == 0 ? 0 : 1);
  }

  public static Map<String, String> options(String[] args) {
    Map<String, String> o = new LinkedHashMap<>();
    for (int i = 0; i + 1 < args.length; i += 2) {
      if (!args[i].startsWith("--")) {
        throw new IllegalArgumentException("expected --name value, got " + args[i]);
      }
      o.put(args[i].substring(2), args[i + 1]);
    }
    return o;
  }

  private static String moveName(
      boolean write, Where from, Where to, Layout layout, TransportOptions options) {
    String shape =
        switch (layout) {
          case CONTIGUOUS -> "contiguous ~128 MiB";
          case SCATTERED -> BLOCKS + " x 32 KiB scattered";
          case ODD -> "1500 odd-sized entries";
        };
    return (write ? "WRITE " : "READ ") + from.label() + "->" + to.label() + " " + shape
        + " (staging " + options.tcpStagingBuffers() + " x " + options.tcpStagingBufferBytes()
        + " B): every byte at the destination";
  }

  // ---- the cases ----------------------------------------------------------------------------

  /**
   * Moves a batch from a region where {@code from} says to one where {@code to} says. WRITE: P
   * holds the source and pushes; READ: D holds the source and P pulls.
   */
  public static void move(
      int pGpu, int dGpu, Where from, Where to, Layout layout, boolean write,
      TransportOptions options) throws Exception {
    long bytes = CAPACITY_BLOCKS * BLOCK_BYTES;
    SplittableRandom random = new SplittableRandom(layout.ordinal() * 31L + (write ? 1 : 2));
    try (Loopback net = new Loopback(options);
        Side src = Side.of(from, write ? net.p : net.d, write ? pGpu : dGpu, bytes);
        Side dst = Side.of(to, write ? net.d : net.p, write ? dGpu : pGpu, bytes);
        Memory srcImage = randomImage(bytes, random.nextLong());
        Memory expected = constantImage(bytes, GUARD);
        Memory back = new Memory(bytes)) {
      src.load(srcImage);
      dst.load(expected);
      long[][] plan = plan(layout, random);
      long[] srcOffsets = plan[0];
      long[] dstOffsets = plan[1];
      long[] sizes = plan[2];
      apply(srcImage, expected, srcOffsets, dstOffsets, sizes);
      TransferBatch batch =
          write ? new TransferBatch(srcOffsets, dstOffsets, sizes)
              : new TransferBatch(dstOffsets, srcOffsets, sizes);
      TransferStatus s =
          write ? net.client.write(src.region, net.server.describe(dst.region), batch)
              : net.client.read(dst.region, net.server.describe(src.region), batch);
      await(s);
      check(s.succeeded(), "transfer failed: " + s);
      check(s.bytesMoved() == batch.totalBytes(),
          "moved " + s.bytesMoved() + " of " + batch.totalBytes() + " bytes");
      dst.readInto(back);
      compare(expected, back, bytes, "destination");
      src.readInto(back);
      compare(srcImage, back, bytes, "source");
    }
  }

  /** P's own entry is past its region: the client refuses at once; D's bytes stay guard. */
  public static void outOfBoundsLocally(int pGpu, int dGpu) throws Exception {
    long bytes = 1 << 20;
    try (Loopback net = new Loopback(TransportOptions.defaults());
        Side p = Side.of(Where.GPU, net.p, pGpu, bytes);
        Side d = Side.of(Where.GPU, net.d, dGpu, bytes);
        Memory pImage = randomImage(bytes, 5);
        Memory guard = constantImage(bytes, GUARD);
        Memory back = new Memory(bytes)) {
      p.load(pImage);
      d.load(guard);
      TransferBatch batch =
          new TransferBatch(
              new long[] {0, bytes - 4096}, new long[] {0, 65536}, new long[] {65536, 8192});
      RegionDescriptor remote = net.server.describe(d.region);
      for (boolean write : new boolean[] {true, false}) {
        TransferStatus s =
            write ? net.client.write(p.region, remote, batch) : net.client.read(p.region, remote, batch);
        await(s);
        check(!s.succeeded(), (write ? "write" : "read") + " succeeded: " + s);
        check(s.failureMessage().contains("lies outside region " + p.region.id())
                && s.failureMessage().contains("nothing was moved"),
            "unexpected reason: " + s.failureMessage());
      }
      d.readInto(back);
      compare(guard, back, bytes, "D's region");
      p.readInto(back);
      compare(pImage, back, bytes, "P's region");
    }
  }

  /**
   * D's descriptor claims a larger region than D registered: the client's own check passes, the
   * listener refuses the frame before reading or sending a byte of it, and then still serves a
   * valid batch on the same transports.
   */
  public static void outOfBoundsAtTheListener(int pGpu, int dGpu) throws Exception {
    long bytes = 1 << 20;
    try (Loopback net = new Loopback(TransportOptions.defaults());
        Side p = Side.of(Where.GPU, net.p, pGpu, bytes);
        Side d = Side.of(Where.GPU, net.d, dGpu, bytes);
        Memory pImage = randomImage(bytes, 6);
        Memory dImage = constantImage(bytes, GUARD);
        Memory back = new Memory(bytes)) {
      p.load(pImage);
      d.load(dImage);
      RegionDescriptor real = net.server.describe(d.region);
      RegionDescriptor liar =
          new RegionDescriptor(real.regionId(), 1L << 30, RegionKind.CUDA, real.device(),
              real.owner(), real.pid(), real.baseAddress(), real.bootId(), real.tcpHost(),
              real.tcpPort(), real.token(), null);
      TransferBatch batch =
          new TransferBatch(
              new long[] {0, 65536}, new long[] {0, 2L << 20}, new long[] {65536, 65536});
      for (boolean write : new boolean[] {true, false}) {
        TransferStatus s =
            write ? net.client.write(p.region, liar, batch) : net.client.read(p.region, liar, batch);
        await(s);
        check(!s.succeeded(), (write ? "write" : "read") + " succeeded: " + s);
        check(s.failureMessage().contains("refused the " + (write ? "write" : "read"))
                && s.failureMessage().contains("lies outside region " + d.region.id() + " of D0"),
            "unexpected reason: " + s.failureMessage());
      }
      d.readInto(back);
      compare(dImage, back, bytes, "D's region after the refused write");
      p.readInto(back);
      compare(pImage, back, bytes, "P's region after the refused read");

      TransferBatch valid =
          new TransferBatch(new long[] {0}, new long[] {4096}, new long[] {65536});
      TransferStatus ok = net.client.write(p.region, real, valid);
      await(ok);
      check(ok.succeeded(), "a valid write after the refusals failed: " + ok);
      apply(pImage, dImage, valid.localOffsets(), valid.remoteOffsets(), valid.sizes());
      d.readInto(back);
      compare(dImage, back, bytes, "D's region after the valid write");
    }
  }

  // ---- plans and images -----------------------------------------------------------------------

  /** {source offsets, destination offsets, sizes} of a layout, inside CAPACITY_BLOCKS blocks. */
  public static long[][] plan(Layout layout, SplittableRandom random) {
    long bytes = CAPACITY_BLOCKS * BLOCK_BYTES;
    return switch (layout) {
      case CONTIGUOUS -> new long[][] {{4096}, {8192}, {BLOCKS * BLOCK_BYTES - 3}};
      case SCATTERED -> {
        int[] from = shuffled(CAPACITY_BLOCKS, random);
        int[] to = shuffled(CAPACITY_BLOCKS, random);
        long[] s = new long[BLOCKS];
        long[] d = new long[BLOCKS];
        long[] n = new long[BLOCKS];
        for (int i = 0; i < BLOCKS; i++) {
          s[i] = from[i] * BLOCK_BYTES;
          d[i] = to[i] * BLOCK_BYTES;
          n[i] = BLOCK_BYTES;
        }
        yield new long[][] {s, d, n};
      }
      case ODD -> {
        int count = 1500;
        long[] n = new long[count];
        for (int i = 0; i < count; i++) {
          n[i] = 1 + random.nextInt(100 * 1024);
        }
        long[] s = pack(n, identity(count), random, bytes);
        long[] d = pack(n, shuffled(count, random), random, bytes);
        yield new long[][] {s, d, n};
      }
    };
  }

  /** Places entries one after another in {@code order}, with a gap of 0 (adjacent) to 8 KiB. */
  private static long[] pack(long[] sizes, int[] order, SplittableRandom random, long limit) {
    long[] offsets = new long[sizes.length];
    long at = 0;
    for (int i : order) {
      at += random.nextBoolean() ? 0 : random.nextInt(8192);
      offsets[i] = at;
      at += sizes[i];
    }
    if (at > limit) {
      throw new IllegalStateException("plan of " + at + " bytes exceeds the region's " + limit);
    }
    return offsets;
  }

  private static int[] identity(int n) {
    int[] a = new int[n];
    for (int i = 0; i < n; i++) {
      a[i] = i;
    }
    return a;
  }

  private static int[] shuffled(int n, SplittableRandom random) {
    int[] a = identity(n);
    for (int i = n - 1; i > 0; i--) {
      int j = random.nextInt(i + 1);
      int t = a[i];
      a[i] = a[j];
      a[j] = t;
    }
    return a;
  }

  public static Memory randomImage(long bytes, long seed) {
    Memory m = new Memory(bytes);
    SplittableRandom random = new SplittableRandom(seed);
    LongBuffer longs = m.getByteBuffer(0, bytes).asLongBuffer();
    while (longs.hasRemaining()) {
      longs.put(random.nextLong());
    }
    return m;
  }

  public static Memory constantImage(long bytes, byte value) {
    Memory m = new Memory(bytes);
    m.setMemory(0, bytes, value);
    return m;
  }

  /** Applies the batch to host images: what the destination must hold afterwards. */
  public static void apply(Memory src, Memory dst, long[] srcOffsets, long[] dstOffsets, long[] sizes) {
    ByteBuffer from = src.getByteBuffer(0, src.size());
    ByteBuffer to = dst.getByteBuffer(0, dst.size());
    for (int i = 0; i < sizes.length; i++) {
      to.put((int) dstOffsets[i], from, (int) srcOffsets[i], (int) sizes[i]);
    }
  }

  public static void compare(Memory expected, Memory actual, long bytes, String what) {
    int at = expected.getByteBuffer(0, bytes).mismatch(actual.getByteBuffer(0, bytes));
    check(at < 0,
        what + " differs first at byte " + at + ": expected " + (expected.getByte(Math.max(at, 0)) & 0xFF)
            + ", found " + (actual.getByte(Math.max(at, 0)) & 0xFF));
  }

  public static void check(boolean condition, String message) {
    if (!condition) {
      throw new AssertionError(message);
    }
  }

  public static void await(TransferStatus s) throws Exception {
    s.completion().get(WAIT_SECONDS, TimeUnit.SECONDS);
  }

  // ---- the two sides -----------------------------------------------------------------------------

  /** P (client, no listener) and D (listener) on loopback, each with its own registry. */
  public static final class Loopback implements AutoCloseable {
    final RegionRegistry p = new RegionRegistry("P0");
    final RegionRegistry d = new RegionRegistry("D0");
    final TcpTransport client;
    final TcpTransport server;

    Loopback(TransportOptions options) throws IOException {
      client = new TcpTransport(p, options.withTcpListener(false));
      server = new TcpTransport(d, options);
    }

    @Override
    public void close() {
      client.close();
      server.close();
      p.close();
      d.close();
    }
  }

  /** A registered region in GPU or host memory, loaded and read back whole. */
  public static final class Side implements AutoCloseable {
    public final MemoryRegion region;
    private final long gpuAddress; // 0 for host memory
    private final int device;

    private Side(MemoryRegion region, long gpuAddress, int device) {
      this.region = region;
      this.gpuAddress = gpuAddress;
      this.device = device;
    }

    public static Side of(Where where, RegionRegistry registry, int device, long bytes) {
      if (where == Where.HOST) {
        return new Side(registry.allocateHost(bytes), 0, -1);
      }
      Cuda.setDevice(device);
      long address = Cuda.malloc(bytes);
      return new Side(registry.registerExternal(address, bytes, RegionKind.CUDA, device), address, device);
    }

    public void load(Memory image) {
      copy(region.address(), Pointer.nativeValue(image));
    }

    public void readInto(Memory image) {
      copy(Pointer.nativeValue(image), region.address());
    }

    private void copy(long to, long from) {
      long bytes = region.lengthBytes();
      if (gpuAddress == 0) {
        new Pointer(to).getByteBuffer(0, bytes).put(new Pointer(from).getByteBuffer(0, bytes));
      } else {
        Cuda.setDevice(device);
        Cuda.memcpy(to, from, bytes);
      }
    }

    @Override
    public void close() {
      region.close();
      if (gpuAddress != 0) {
        Cuda.setDevice(device);
        Cuda.free(gpuAddress);
      }
    }
  }
}
