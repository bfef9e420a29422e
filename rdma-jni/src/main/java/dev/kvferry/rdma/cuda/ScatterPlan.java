package dev.kvferry.rdma.cuda;

import com.sun.jna.Pointer;
import dev.kvferry.rdma.TransferBatch;

/**
 * A {@link TransferBatch} uploaded to one device for the scatter-copy kernel: the local and remote
 * offsets, the sizes, and the batch cut into {@link CudaKernels#CHUNK_BYTES} chunks (each chunk's
 * entry and first byte within it), so one launch spreads any mix of small and large entries over
 * the whole GPU. Uploaded once on a stream and reused for every layer that shares the plan. The
 * offsets are relative, so one plan serves any pair of regions.
 */
public final class ScatterPlan implements AutoCloseable {

  private final int device;
  private final int count;
  private final long chunks;
  private final PlanBuffers buffers;
  private final PlanBuffers.Pair buffer;
  private final long localOffsets;
  private final long remoteOffsets;
  private final long sizes;
  private final long chunkWithin;
  private final long chunkEntry;
  private final long totalBytes;
  private boolean closed;

  private ScatterPlan(int device, TransferBatch batch, long stream, PlanBuffers buffers) {
    this.device = device;
    this.count = batch.count();
    long c = 0;
    long total = 0;
    for (long s : batch.sizes()) {
      c += (s + CudaKernels.CHUNK_BYTES - 1) / CudaKernels.CHUNK_BYTES;
      total += s;
    }
    this.chunks = c;
    this.totalBytes = total;
    long bytes = 24L * count + 12L * chunks + 8;
    this.buffers = buffers;
    this.buffer = buffers.take(bytes);
    long dev = buffer.device();
    this.localOffsets = dev;
    this.remoteOffsets = dev + 8L * count;
    this.sizes = dev + 16L * count;
    this.chunkWithin = dev + 24L * count;
    this.chunkEntry = dev + 24L * count + 8L * chunks;
    Pointer h = new Pointer(buffer.host());
    h.write(0, batch.localOffsets(), 0, count);
    h.write(8L * count, batch.remoteOffsets(), 0, count);
    h.write(16L * count, batch.sizes(), 0, count);
    // Built in Java and written with one native call each: a call per chunk (two JNA calls each)
    // was most of a 4,096-token request's plan upload, which the request's first layer waits for.
    int n = Math.toIntExact(chunks);
    long[] within = new long[n];
    int[] entry = new int[n];
    int k = 0;
    for (int e = 0; e < count; e++) {
      long s = batch.sizes()[e];
      for (long off = 0; off < s; off += CudaKernels.CHUNK_BYTES, k++) {
        within[k] = off;
        entry[k] = e;
      }
    }
    h.write(24L * count, within, 0, n);
    h.write(24L * count + 8L * chunks, entry, 0, n);
    Cuda.setDevice(device);
    Cuda.memcpyAsync(dev, buffer.host(), bytes, stream);
  }

  /**
   * Uploads {@code batch} to {@code device}, ordered on {@code stream} before later launches,
   * through a pair of {@code buffers} (of that device) that {@link #close} gives back.
   */
  public static ScatterPlan upload(int device, TransferBatch batch, long stream,
      PlanBuffers buffers) {
    return new ScatterPlan(device, batch, stream, buffers);
  }

  public int device() {
    return device;
  }

  public long totalBytes() {
    return totalBytes;
  }

  /**
   * Launches the copy of every entry on {@code stream}: from {@code srcBase} to {@code dstBase},
   * local offsets on the local side ({@code toRemote} says which side is the destination).
   *
   * @param args a 8-slot {@link KernelArgs} owned by the caller's lane
   */
  public void launch(
      CudaKernels kernels, long localBase, long remoteBase, boolean toRemote, long stream,
      KernelArgs args) {
    if (chunks == 0) {
      return;
    }
    long dstOffsets = toRemote ? remoteOffsets : localOffsets;
    long srcOffsets = toRemote ? localOffsets : remoteOffsets;
    args.set(0, toRemote ? remoteBase : localBase)
        .set(1, toRemote ? localBase : remoteBase)
        .set(2, dstOffsets)
        .set(3, srcOffsets)
        .set(4, sizes)
        .set(5, chunkEntry)
        .set(6, chunkWithin)
        .set(7, chunks);
    int grid = (int) Math.min(chunks, (long) kernels.multiProcessors() * 4);
    Cuda.launchKernel(
        kernels.scatterCopyFunction(), grid, CudaKernels.COPY_THREADS, 0, stream, args.pointer());
  }

  /** Gives the plan's buffers back; only once no launch that uses it is still queued. */
  @Override
  public synchronized void close() {
    if (!closed) {
      closed = true;
      buffers.give(buffer);
    }
  }
}
