package dev.kvferry.bench.jmh;

import dev.kvferry.actors.plan.BlockIdSamples;
import dev.kvferry.actors.plan.InvalidBlockIdsException;
import dev.kvferry.actors.plan.KvCacheGeometry;
import dev.kvferry.actors.plan.TransferPlanner;
import dev.kvferry.rdma.TransferBatch;
import java.util.Random;
import java.util.concurrent.TimeUnit;
import org.openjdk.jmh.annotations.Benchmark;
import org.openjdk.jmh.annotations.BenchmarkMode;
import org.openjdk.jmh.annotations.Fork;
import org.openjdk.jmh.annotations.Measurement;
import org.openjdk.jmh.annotations.Mode;
import org.openjdk.jmh.annotations.OutputTimeUnit;
import org.openjdk.jmh.annotations.Param;
import org.openjdk.jmh.annotations.Scope;
import org.openjdk.jmh.annotations.Setup;
import org.openjdk.jmh.annotations.State;
import org.openjdk.jmh.annotations.Warmup;

/**
 * One request's plan, Llama-3-8B geometry (32 KiB K or V blocks), out of a cache twice the
 * request's size: ids in order (runs merge into one copy per K and V), or scattered on both sides
 * as a cache in use hands them out (no run merges), or scattered on the remote side only.
 */
@State(Scope.Thread)
@BenchmarkMode(Mode.AverageTime)
@OutputTimeUnit(TimeUnit.MICROSECONDS)
@Warmup(iterations = 3, time = 1)
@Measurement(iterations = 5, time = 1)
@Fork(1)
public class PlannerBenchmark {

  @Param({"128", "1024", "8192"})
  int blocks;

  @Param({"contiguous", "scattered", "remote-scattered"})
  String ids;

  private final TransferPlanner planner = new TransferPlanner();
  private KvCacheGeometry geometry;
  private int[] local;
  private int[] remote;

  @Setup
  public void setUp() {
    geometry = KvCacheGeometry.standard(2 * blocks, 16, 8, 128, 2);
    Random r = new Random(42);
    int[] inOrder = new int[blocks];
    for (int i = 0; i < blocks; i++) {
      inOrder[i] = i;
    }
    switch (ids) {
      case "contiguous" -> {
        local = inOrder;
        remote = inOrder.clone();
      }
      case "scattered" -> {
        local = BlockIdSamples.distinct(r, blocks, 2 * blocks);
        remote = BlockIdSamples.distinct(r, blocks, 2 * blocks);
      }
      case "remote-scattered" -> {
        local = inOrder;
        remote = BlockIdSamples.distinct(r, blocks, 2 * blocks);
      }
      default -> throw new IllegalArgumentException("ids: " + ids);
    }
  }

  @Benchmark
  public TransferBatch plan() throws InvalidBlockIdsException {
    return planner.plan(geometry, geometry.numBlocks(), local, remote);
  }

}
