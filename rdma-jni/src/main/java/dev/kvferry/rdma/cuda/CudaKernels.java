package dev.kvferry.rdma.cuda;

import java.io.IOException;
import java.io.InputStream;
import java.io.UncheckedIOException;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;

/**
 * kvferry's kernels (src/main/cuda/kvferry_kernels.cu) loaded from the committed PTX into one
 * device's primary context with {@code cuModuleLoadData}: the scatter copy of the transport, and the
 * pattern fill and check of the simulated engine and the benches. One instance per device.
 */
public final class CudaKernels {

  /** Bytes per chunk of the scatter copy; must match KVF_CHUNK_BYTES in the .cu source. */
  public static final int CHUNK_BYTES = 65536;
  /** Threads per CTA of the scatter copy; must match KVF_COPY_THREADS. */
  public static final int COPY_THREADS = 512;

  static final String PTX_RESOURCE = "/dev/kvferry/rdma/cuda/kvferry_kernels.ptx";
  private static final Map<Integer, CudaKernels> BY_DEVICE = new ConcurrentHashMap<>();

  private final int device;
  private final long module;
  private final long scatterCopy;
  private final long fillPattern;
  private final long verifyPattern;
  private final int multiProcessors;
  private final KernelArgs patternArgs = new KernelArgs(7);
  private final Map<String, Long> functions = new ConcurrentHashMap<>();

  private CudaKernels(int device) {
    this.device = device;
    Cuda.setDevice(device);
    this.module = Cuda.moduleLoadData(ptx());
    this.scatterCopy = Cuda.moduleGetFunction(module, "kvferry_scatter_copy");
    this.fillPattern = Cuda.moduleGetFunction(module, "kvferry_fill_pattern");
    this.verifyPattern = Cuda.moduleGetFunction(module, "kvferry_verify_pattern");
    this.multiProcessors = Cuda.multiProcessorCount(device);
  }

  /** The kernels loaded on {@code device}, loading them on first use. */
  public static CudaKernels forDevice(int device) {
    Cuda.require();
    return BY_DEVICE.computeIfAbsent(device, CudaKernels::new);
  }

  static byte[] ptx() {
    try (InputStream in = CudaKernels.class.getResourceAsStream(PTX_RESOURCE)) {
      if (in == null) {
        throw new IllegalStateException("kernel PTX " + PTX_RESOURCE + " missing from the jar");
      }
      return in.readAllBytes();
    } catch (IOException e) {
      throw new UncheckedIOException(e);
    }
  }

  public int device() {
    return device;
  }

  public int multiProcessors() {
    return multiProcessors;
  }

  /**
   * The handle of kernel {@code entry} of the module (e.g. {@code kvferry_kv_fill}), for {@link
   * Cuda#launchKernel}: callers that own their kernels' arguments launch them themselves.
   */
  public long function(String entry) {
    return functions.computeIfAbsent(entry, e -> {
      Cuda.setDevice(device);
      return Cuda.moduleGetFunction(module, e);
    });
  }

  /** The scatter-copy function handle (launched by {@link ScatterPlan}). */
  long scatterCopyFunction() {
    return scatterCopy;
  }

  /**
   * Fills {@code blocks} blocks of {@code blockBytes} at {@code base + blockOffsets[b]} (a device
   * array of longs) with the pattern of (seed, layer, b), then keeps each CTA busy until {@code
   * spinNs} have passed: a stand-in for one layer's compute. {@code ctas} CTAs of 256 threads.
   */
  public synchronized void fillPattern(
      CudaStream stream, long base, long blockOffsets, int blocks, long blockBytes, int layer,
      int seed, long spinNs, int ctas) {
    checkBlockBytes(blockBytes);
    Cuda.setDevice(device);
    patternArgs.set(0, base).set(1, blockOffsets).setInt(2, blocks).set(3, blockBytes)
        .setInt(4, layer).setInt(5, seed).set(6, spinNs);
    Cuda.launchKernel(fillPattern, ctas, 256, 0, stream.handle(), patternArgs.pointer());
  }

  /**
   * Adds to the device counter {@code mismatchCounter} (an unsigned long) the number of 32-bit
   * words of the blocks that differ from the pattern {@link #fillPattern} writes for (seed, layer,
   * b).
   */
  public synchronized void verifyPattern(
      CudaStream stream, long base, long blockOffsets, int blocks, long blockBytes, int layer,
      int seed, long mismatchCounter) {
    checkBlockBytes(blockBytes);
    Cuda.setDevice(device);
    patternArgs.set(0, base).set(1, blockOffsets).setInt(2, blocks).set(3, blockBytes)
        .setInt(4, layer).setInt(5, seed).set(6, mismatchCounter);
    Cuda.launchKernel(verifyPattern, multiProcessors * 4, 256, 0, stream.handle(),
        patternArgs.pointer());
  }

  private static void checkBlockBytes(long blockBytes) {
    if (blockBytes <= 0 || blockBytes % 4 != 0) {
      throw new IllegalArgumentException("pattern blocks need a positive multiple of 4 bytes, got "
          + blockBytes);
    }
  }
}
