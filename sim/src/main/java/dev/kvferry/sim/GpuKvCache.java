package dev.kvferry.sim;

import com.sun.jna.Memory;
import com.sun.jna.Pointer;
import dev.kvferry.actors.connector.CudaLayerEvent;
import dev.kvferry.actors.connector.LayerEvent;
import dev.kvferry.actors.plan.KvCacheGeometry;
import dev.kvferry.rdma.MemoryRegion;
import dev.kvferry.rdma.RegionKind;
import dev.kvferry.rdma.RegionRegistry;
import dev.kvferry.rdma.cuda.Cuda;
import dev.kvferry.rdma.cuda.CudaEvent;
import dev.kvferry.rdma.cuda.CudaStream;
import dev.kvferry.rdma.cuda.KernelArgs;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.locks.LockSupport;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;
import org.jspecify.annotations.Nullable;

/**
 * The KV cache on one GPU: each rank's layers cudaMalloc'd and registered as CUDA regions (moved
 * by the {@code cuda} transport), filled by {@code kvferry_kv_fill} on the engine's compute stream
 * and checked by {@code kvferry_kv_verify} (sim_kernels.cu, loaded by {@link SimKernels}), which compute the
 * same bytes as {@link KvPattern}. All TP ranks of the engine share the device and the stream.
 *
 * <p>Per call, the token table (byte offset, request key, position per token) goes through a
 * pinned staging buffer and one async copy; a buffer is reused only once the event recorded
 * behind its last kernel has completed, so the engine's thread never waits for the GPU.
 */
public final class GpuKvCache implements SimKvCache {

  private static final Logger log = LoggerFactory.getLogger(GpuKvCache.class);
  private static final int THREADS = 128;
  /** Longs per token of the table the kernels read: K slot offset, request key, position. */
  private static final int TOKEN_LONGS = 3;
  private static final long MIN_STAGING_BYTES = 64 << 10;

  private final int device;
  private final KvCacheGeometry geometry;
  private final int ranks;
  private final int layers;
  private final int kvs;
  private final int heads;
  private final int headBytes;
  private final int slotWords;
  private final List<List<MemoryRegion>> regions = new ArrayList<>();
  private final List<long[]> layerAddresses = new ArrayList<>();
  /** Per rank, a device array of its layers' addresses (for the check over all layers). */
  private final List<Long> layerTables = new ArrayList<>();
  /**
   * Per step slot, per rank, its layers' events. A step records into the events of slot {@code
   * step % EVENT_SLOTS}, and waits for the step that last used that slot to finish first: an
   * event handed to the connector is recorded again only steps later, after it completed, so a
   * waiter (the tcp path polls the event) never sees it go back to pending before it saw it done.
   */
  private static final int EVENT_SLOTS = 4;
  private final List<CudaEvent[]> layerEvents = new ArrayList<>();
  private final Fence[] slotFences = new Fence[EVENT_SLOTS];
  private long steps;
  private final List<Staging> staging = new ArrayList<>();
  private final List<CudaEvent> fenceEvents = new ArrayList<>();
  private final ArrayDeque<CudaEvent> spareFenceEvents = new ArrayDeque<>();
  private final KernelArgs fillArgs = new KernelArgs(9);
  private final KernelArgs verifyArgs = new KernelArgs(10);
  private CudaStream stream;
  private long fillKernel;
  private long verifyKernel;
  private int maxCtas;
  private boolean closed;

  /** A pinned host buffer and a device buffer of the same size, busy until {@code done}. */
  private static final class Staging {
    final long host;
    final long device;
    final long capacityBytes;
    final CudaEvent done;
    boolean inUse;

    Staging(long host, long device, long capacityBytes, CudaEvent done) {
      this.host = host;
      this.device = device;
      this.capacityBytes = capacityBytes;
      this.done = done;
    }
  }

  /**
   * Allocates and registers {@code layers} layers of {@code geometry} per rank on GPU {@code
   * device}, zeroed.
   *
   * @param registries per TP rank (in rank order), the registry its regions join
   */
  public GpuKvCache(int device, KvCacheGeometry geometry, int layers, List<RegionRegistry> registries) {
    Cuda.requireDevice(device);
    this.device = device;
    this.geometry = geometry;
    this.ranks = registries.size();
    this.layers = layers;
    this.kvs = KvPattern.slotsPerToken(geometry);
    this.heads = KvPattern.headsPerSlot(geometry);
    this.headBytes = KvPattern.headBytes(geometry);
    this.slotWords = heads * KvPattern.wordsPerHead(headBytes);
    if (ranks < 1 || layers < 1) {
      throw new IllegalArgumentException("need at least one rank and one layer");
    }
    try {
      Cuda.setDevice(device);
      stream = CudaStream.create(device);
      SimKernels kernels = SimKernels.forDevice(device);
      fillKernel = kernels.function("kvferry_kv_fill");
      verifyKernel = kernels.function("kvferry_kv_verify");
      maxCtas = kernels.multiProcessors() * 8;
      long layerBytes = geometry.layerRegionBytes();
      for (RegionRegistry registry : registries) {
        List<MemoryRegion> rankRegions = new ArrayList<>();
        long[] addresses = new long[layers];
        regions.add(rankRegions);
        for (int l = 0; l < layers; l++) {
          long ptr = Cuda.malloc(layerBytes);
          try {
            Cuda.memset(ptr, 0, layerBytes);
          } catch (RuntimeException e) {
            Cuda.free(ptr);
            throw e;
          }
          addresses[l] = ptr;
          // The region frees the memory once no transfer uses it any more.
          rankRegions.add(registry.registerExternal(ptr, layerBytes, RegionKind.CUDA, device,
              () -> freeQuietly(ptr)));
        }
        layerAddresses.add(addresses);
        layerTables.add(upload(addresses));
      }
      for (int slot = 0; slot < EVENT_SLOTS; slot++) {
        CudaEvent[] events = new CudaEvent[ranks * layers]; // by rank * layers + layer
        layerEvents.add(events); // listed first, so close() frees those created if one fails
        for (int i = 0; i < events.length; i++) {
          events[i] = CudaEvent.create(device, false);
        }
      }
    } catch (RuntimeException e) {
      close();
      throw e;
    }
  }

  private void freeQuietly(long ptr) {
    try {
      Cuda.setDevice(device);
      Cuda.free(ptr);
    } catch (RuntimeException e) {
      log.warn("freeing KV layer memory on GPU {} failed: {}", device, e.getMessage());
    }
  }

  private static long upload(long[] values) {
    long dev = Cuda.malloc(8L * values.length);
    try (Memory host = new Memory(8L * values.length)) {
      host.write(0, values, 0, values.length);
      Cuda.memcpy(dev, Pointer.nativeValue(host), 8L * values.length);
    }
    return dev;
  }

  public int device() {
    return device;
  }

  @Override
  public List<MemoryRegion> layerRegions(int rank) {
    return List.copyOf(regions.get(rank));
  }

  @Override
  public int ranks() {
    return ranks;
  }

  @Override
  public int layers() {
    return layers;
  }

  @Override
  public ForwardPass forward(List<TokenRange> ranges) {
    Cuda.setDevice(device);
    int tokens = ranges.stream().mapToInt(TokenRange::tokens).sum();
    Staging s = stage(tokenTable(ranges, tokens, 0));
    int slot = (int) (steps++ % EVENT_SLOTS);
    awaitSlot(slot);
    CudaEvent[] events = layerEvents.get(slot);
    return new ForwardPass() {
      @Override
      public LayerEvent layer(int rank, int layer) {
        Cuda.setDevice(device);
        launchFill(rank, layer, s.device, tokens);
        CudaEvent e = events[rank * layers + layer];
        e.record(stream);
        return new CudaLayerEvent(e);
      }

      @Override
      public Fence end() {
        release(s);
        Fence f = fence();
        slotFences[slot] = f;
        return f;
      }
    };
  }

  @Override
  public void fill(TokenRange range) {
    if (range.tokens() == 0) {
      return;
    }
    Cuda.setDevice(device);
    Staging s = stage(tokenTable(List.of(range), range.tokens(), 0));
    for (int rank = 0; rank < ranks; rank++) {
      for (int layer = 0; layer < layers; layer++) {
        launchFill(rank, layer, s.device, range.tokens());
      }
    }
    release(s);
  }

  @Override
  public Check check(TokenRange range) {
    int tokens = range.tokens();
    // The smallest mismatch key must fit in 64 bits (it does for any cache that fits a GPU).
    Math.multiplyExact(Math.multiplyExact(Math.multiplyExact((long) layers, tokens),
        (long) kvs * slotWords), 8L);
    Cuda.setDevice(device);
    long[] values = tokenTable(List.of(range), tokens, 2 * ranks);
    int results = tokens * TOKEN_LONGS;
    for (int rank = 0; rank < ranks; rank++) {
      values[results + 2 * rank] = 0; // mismatched words
      values[results + 2 * rank + 1] = -1; // smallest mismatch key: none yet
    }
    Staging s = stage(values);
    long resultOffset = 8L * results;
    for (int rank = 0; rank < ranks && tokens > 0; rank++) {
      verifyArgs.set(0, layerTables.get(rank)).setInt(1, layers).set(2, s.device)
          .setInt(3, tokens).setInt(4, kvs).set(5, geometry.kToVStrideBytes()).setInt(6, heads)
          .setInt(7, headBytes).setInt(8, KvPattern.firstHead(geometry, rank))
          .set(9, s.device + resultOffset + 16L * rank);
      Cuda.launchKernel(verifyKernel, ctas((long) layers * tokens * kvs), THREADS, 0,
          stream.handle(), verifyArgs.pointer());
    }
    Cuda.memcpyAsync(s.host + resultOffset, s.device + resultOffset, 16L * ranks, stream.handle());
    s.done.record(stream);
    return new Check() {
      private boolean done;
      private KvPattern.@Nullable Mismatch first;

      @Override
      public boolean isDone() {
        if (!done && s.done.isComplete()) {
          first = readResults(range, new Pointer(s.host + resultOffset));
          s.inUse = false;
          done = true;
        }
        return done;
      }

      @Override
      public KvPattern.@Nullable Mismatch firstMismatch() {
        if (!isDone()) {
          throw new IllegalStateException("the check is still running on the GPU");
        }
        return first;
      }
    };
  }

  /** The first mismatch over the ranks' results (rank order), or null; logs the word count. */
  private KvPattern.@Nullable Mismatch readResults(TokenRange range, Pointer results) {
    long words = 0;
    KvPattern.@Nullable Mismatch first = null;
    for (int rank = 0; rank < ranks; rank++) {
      long bad = results.getLong(16L * rank);
      words += bad;
      if (bad != 0 && first == null) {
        first = locate(geometry, range, results.getLong(16L * rank + 8));
        if (ranks > 1) {
          first = first.onRank(rank);
        }
      }
    }
    if (first != null) {
      log.warn("GPU {} check of request key {}: {} mismatched 8-byte words; first: {}", device,
          Long.toHexString(range.requestKey()), words, first);
    }
    return first;
  }

  /**
   * Decodes kvferry_kv_verify's location key (see the .cu) for a check of {@code range} into the
   * mismatch {@link KvPattern#verify} reports.
   */
  static KvPattern.Mismatch locate(KvCacheGeometry g, TokenRange range, long key) {
    int headBytes = KvPattern.headBytes(g);
    int wordsPerHead = KvPattern.wordsPerHead(headBytes);
    int slotWords = KvPattern.headsPerSlot(g) * wordsPerHead;
    int kvs = KvPattern.slotsPerToken(g);
    int b = (int) Long.remainderUnsigned(key, 8);
    long rest = Long.divideUnsigned(key, 8);
    int i = (int) (rest % slotWords);
    long slot = rest / slotWords;
    int kv = (int) (slot % kvs);
    long layerToken = slot / kvs;
    int t = (int) (layerToken % range.tokens());
    int layer = (int) (layerToken / range.tokens());
    int position = range.fromToken() + t;
    int block = range.blockIds()[position / g.blockSize()];
    int h = i / wordsPerHead;
    int w = i % wordsPerHead;
    long offset = KvPattern.slotOffset(g, block, position, kv) + (long) h * headBytes + 8L * w + b;
    return new KvPattern.Mismatch(layer, block, position, kv, offset);
  }

  /** Waits (on the GPU's pace, EVENT_SLOTS steps behind) until the slot's last step is done. */
  private void awaitSlot(int slot) {
    Fence last = slotFences[slot];
    while (last != null && !last.isComplete()) {
      LockSupport.parkNanos(20_000L);
    }
  }

  @Override
  public Fence fence() {
    Cuda.setDevice(device);
    CudaEvent e = spareFenceEvents.poll();
    if (e == null) {
      e = CudaEvent.create(device, false);
      fenceEvents.add(e);
    }
    e.record(stream);
    CudaEvent event = e;
    return new Fence() {
      private boolean complete;

      @Override
      public boolean isComplete() {
        if (!complete && event.isComplete()) {
          complete = true;
          spareFenceEvents.add(event);
        }
        return complete;
      }
    };
  }

  private void launchFill(int rank, int layer, long table, int tokens) {
    if (tokens == 0) {
      return;
    }
    fillArgs.set(0, layerAddresses.get(rank)[layer]).set(1, table).setInt(2, tokens)
        .setInt(3, kvs).set(4, geometry.kToVStrideBytes()).setInt(5, heads).setInt(6, headBytes)
        .setInt(7, KvPattern.firstHead(geometry, rank)).setInt(8, layer);
    Cuda.launchKernel(fillKernel, ctas((long) tokens * kvs), THREADS, 0, stream.handle(),
        fillArgs.pointer());
  }

  private int ctas(long slots) {
    return (int) Math.max(1, Math.min(slots, maxCtas));
  }

  /** The kernels' token table for {@code ranges}, with {@code extraLongs} free longs after it. */
  private long[] tokenTable(List<TokenRange> ranges, int tokens, int extraLongs) {
    long[] table = new long[tokens * TOKEN_LONGS + extraLongs];
    int i = 0;
    for (TokenRange r : ranges) {
      for (int pos = r.fromToken(); pos < r.toToken(); pos++) {
        int block = r.blockIds()[pos / geometry.blockSize()];
        table[i++] = KvPattern.slotOffset(geometry, block, pos, 0);
        table[i++] = r.requestKey();
        table[i++] = pos;
      }
    }
    return table;
  }

  /** Copies {@code values} to a free staging buffer's device side, queued on the stream. */
  private Staging stage(long[] values) {
    long bytes = Math.max(8L, 8L * values.length);
    Staging s = null;
    for (Staging candidate : staging) {
      if (!candidate.inUse && candidate.capacityBytes >= bytes && candidate.done.isComplete()) {
        s = candidate;
        break;
      }
    }
    if (s == null) {
      long capacity = Math.max(MIN_STAGING_BYTES, Long.highestOneBit(bytes - 1) << 1);
      long host = Cuda.hostAlloc(capacity);
      long dev;
      try {
        dev = Cuda.malloc(capacity);
      } catch (RuntimeException e) {
        Cuda.freeHost(host);
        throw e;
      }
      s = new Staging(host, dev, capacity, CudaEvent.create(device, false));
      staging.add(s);
    }
    s.inUse = true;
    if (values.length > 0) {
      new Pointer(s.host).write(0, values, 0, values.length);
      Cuda.memcpyAsync(s.device, s.host, 8L * values.length, stream.handle());
    }
    return s;
  }

  /** The kernels reading {@code s} are queued: it is free once they are done. */
  private void release(Staging s) {
    s.done.record(stream);
    s.inUse = false;
  }

  /**
   * Waits for the stream (shutdown may block), closes the regions (their memory is freed once
   * no transfer uses it) and frees the rest.
   */
  @Override
  public synchronized void close() {
    if (closed) {
      return;
    }
    closed = true;
    try {
      Cuda.setDevice(device);
      if (stream != null) {
        stream.synchronize();
      }
    } catch (RuntimeException e) {
      log.warn("GPU {}: waiting for the simulated engine's stream failed: {}", device,
          e.getMessage());
    }
    regions.forEach(rank -> rank.forEach(MemoryRegion::close));
    List<Runnable> frees = new ArrayList<>();
    layerEvents.forEach(events -> {
      for (CudaEvent e : events) {
        if (e != null) {
          frees.add(e::close);
        }
      }
    });
    fenceEvents.forEach(e -> frees.add(e::close));
    for (Staging s : staging) {
      frees.add(s.done::close);
      frees.add(() -> Cuda.freeHost(s.host));
      frees.add(() -> Cuda.free(s.device));
    }
    layerTables.forEach(t -> frees.add(() -> Cuda.free(t)));
    if (stream != null) {
      frees.add(stream::close);
    }
    for (Runnable f : frees) {
      try {
        f.run();
      } catch (RuntimeException e) {
        log.warn("GPU {}: freeing the simulated engine's CUDA resources: {}", device,
            e.getMessage());
      }
    }
  }
}
