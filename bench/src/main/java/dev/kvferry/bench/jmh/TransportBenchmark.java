package dev.kvferry.bench.jmh;

import dev.kvferry.actors.plan.BlockIdSamples;
import dev.kvferry.rdma.CmaTransport;
import dev.kvferry.rdma.LocalTransport;
import dev.kvferry.rdma.MemoryRegion;
import dev.kvferry.rdma.RegionDescriptor;
import dev.kvferry.rdma.RegionRegistry;
import dev.kvferry.rdma.TransferBatch;
import dev.kvferry.rdma.TransferStatus;
import dev.kvferry.rdma.Transport;
import java.util.Random;
import java.util.concurrent.TimeUnit;
import org.openjdk.jmh.annotations.Benchmark;
import org.openjdk.jmh.annotations.BenchmarkMode;
import org.openjdk.jmh.annotations.Fork;
import org.openjdk.jmh.annotations.Level;
import org.openjdk.jmh.annotations.Measurement;
import org.openjdk.jmh.annotations.Mode;
import org.openjdk.jmh.annotations.OutputTimeUnit;
import org.openjdk.jmh.annotations.Param;
import org.openjdk.jmh.annotations.Scope;
import org.openjdk.jmh.annotations.Setup;
import org.openjdk.jmh.annotations.State;
import org.openjdk.jmh.annotations.TearDown;
import org.openjdk.jmh.annotations.Warmup;

/**
 * The transports' per-batch path for one layer of one request (Llama-3-8B, 32 KiB K or V blocks):
 * bounds checks, merging runs, the copy itself. {@code local} copies within this process with
 * {@code MemorySegment}-free ByteBuffer copies; {@code cma} goes through process_vm_writev into this
 * same process, so the figure is the syscall path without a second process. Batches stay under
 * the CMA inline limit (1 MiB) at 16 blocks, so the small case also shows per-call overhead.
 */
@State(Scope.Thread)
@BenchmarkMode(Mode.AverageTime)
@OutputTimeUnit(TimeUnit.MICROSECONDS)
@Warmup(iterations = 3, time = 1)
@Measurement(iterations = 5, time = 1)
@Fork(1)
public class TransportBenchmark {

  private static final long BLOCK_BYTES = 32 * 1024;

  @Param({"local", "cma"})
  String transport;

  /** Copies in the batch: 16 (under the CMA inline limit) or 256 (a 2,048-token layer). */
  @Param({"16", "256"})
  int blocks;

  @Param({"contiguous", "scattered"})
  String layout;

  private RegionRegistry registry;
  private Transport t;
  private MemoryRegion source;
  private RegionDescriptor destination;
  private TransferBatch batch;

  @Setup(Level.Trial)
  public void setUp() {
    registry = new RegionRegistry("jmh");
    long bytes = 2 * blocks * BLOCK_BYTES;
    source = registry.allocateHost(bytes);
    MemoryRegion target = registry.allocateHost(bytes);
    t = transport.equals("cma") ? new CmaTransport() : new LocalTransport(registry);
    destination = t.describe(target);
    int[] from = order(blocks, 2 * blocks, layout.equals("scattered"), 1);
    int[] to = order(blocks, 2 * blocks, layout.equals("scattered"), 2);
    long[] lo = new long[blocks];
    long[] ro = new long[blocks];
    long[] sz = new long[blocks];
    for (int i = 0; i < blocks; i++) {
      lo[i] = from[i] * BLOCK_BYTES;
      ro[i] = to[i] * BLOCK_BYTES;
      sz[i] = BLOCK_BYTES;
    }
    batch = new TransferBatch(lo, ro, sz);
  }

  @TearDown(Level.Trial)
  public void tearDown() {
    t.close();
    registry.close();
  }

  @Benchmark
  public TransferStatus write() {
    TransferStatus s = t.write(source, destination, batch).completion().join();
    if (!s.succeeded()) {
      throw new IllegalStateException(s.failureMessage());
    }
    return s;
  }

  private static int[] order(int n, int of, boolean scattered, long seed) {
    if (!scattered) {
      int[] inOrder = new int[n];
      for (int i = 0; i < n; i++) {
        inOrder[i] = i;
      }
      return inOrder;
    }
    return BlockIdSamples.distinct(new Random(seed), n, of);
  }
}
