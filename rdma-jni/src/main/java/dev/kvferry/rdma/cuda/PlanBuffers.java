package dev.kvferry.rdma.cuda;

import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;

/**
 * One device's buffers for {@link ScatterPlan}s: a page-locked host staging buffer and a device
 * buffer of the same size, reused from plan to plan. Allocating them per plan put
 * {@code cudaHostAlloc} and {@code cudaMalloc} in front of the first layer's copy of every
 * request (a READ's layer 0 queued 192-230 us after its start against 19-56 us for the later
 * layers, docs/gpu.md), and each retired plan's {@code cudaFree} waited for the node's GPU work.
 *
 * <p>Sizes are rounded up to a power of two, at least {@link #MIN_BYTES}, so one class serves most
 * requests; at most {@code maxPooledBytes} are kept free, the rest is freed. A pair is handed back
 * only once no copy still queued reads it (the plan's owner waits for its fence first).
 */
public final class PlanBuffers implements AutoCloseable {

  /** The smallest class: a plan of about 1,800 entries of up to 64 KiB each fits in one. */
  public static final long MIN_BYTES = 64 * 1024;

  /** A staging buffer and its device twin, {@code bytes} each. */
  public record Pair(long host, long device, long bytes) {}

  /** Where pairs come from and go to (CUDA's allocator; another in tests of the pooling). */
  public interface Allocator {
    Pair allocate(long bytes);

    void free(Pair pair);
  }

  private final Allocator allocator;
  private final long maxPooledBytes;
  private final Map<Long, ArrayDeque<Pair>> free = new HashMap<>();
  private long pooledBytes;
  private long allocations;
  private boolean closed;

  public PlanBuffers(Allocator allocator, long maxPooledBytes) {
    this.allocator = allocator;
    this.maxPooledBytes = maxPooledBytes;
  }

  /** Pinned host memory and device memory of {@code device}, through the CUDA runtime. */
  public static PlanBuffers forDevice(int device, long maxPooledBytes) {
    return new PlanBuffers(new Allocator() {
      @Override
      public Pair allocate(long bytes) {
        Cuda.setDevice(device);
        // Page-locked staging, so the upload is truly asynchronous and never waits for the stream.
        long host = Cuda.hostAlloc(bytes);
        try {
          return new Pair(host, Cuda.malloc(bytes), bytes);
        } catch (CudaException e) {
          Cuda.freeHost(host);
          throw e;
        }
      }

      @Override
      public void free(Pair pair) {
        Cuda.setDevice(device);
        Cuda.free(pair.device());
        Cuda.freeHost(pair.host());
      }
    }, maxPooledBytes);
  }

  /** The size class of a request for {@code bytes}. */
  static long sizeClass(long bytes) {
    if (bytes <= MIN_BYTES) {
      return MIN_BYTES;
    }
    long c = Long.highestOneBit(bytes);
    return c == bytes ? c : c << 1;
  }

  /** A pair of at least {@code bytes}: a free one of its class, else a new one. */
  public Pair take(long bytes) {
    long size = sizeClass(bytes);
    synchronized (this) {
      if (closed) {
        throw new IllegalStateException("plan buffers are closed");
      }
      ArrayDeque<Pair> q = free.get(size);
      Pair p = q == null ? null : q.poll();
      if (p != null) {
        pooledBytes -= size;
        return p;
      }
      allocations++;
    }
    return allocator.allocate(size); // outside the lock: the driver's call is the slow part
  }

  /** Takes back a pair no queued copy reads any more; kept for reuse while under the bound. */
  public void give(Pair pair) {
    synchronized (this) {
      if (!closed && pooledBytes + pair.bytes() <= maxPooledBytes) {
        free.computeIfAbsent(pair.bytes(), k -> new ArrayDeque<>()).push(pair);
        pooledBytes += pair.bytes();
        return;
      }
    }
    allocator.free(pair);
  }

  /** Bytes held free for reuse. */
  public synchronized long pooledBytes() {
    return pooledBytes;
  }

  /** Pairs allocated so far (a take that found none free). */
  public synchronized long allocations() {
    return allocations;
  }

  /** Frees the pairs held; pairs given back later are freed at once. */
  @Override
  public void close() {
    List<Pair> held = new ArrayList<>();
    synchronized (this) {
      closed = true;
      free.values().forEach(held::addAll);
      free.clear();
      pooledBytes = 0;
    }
    held.forEach(allocator::free);
  }
}
