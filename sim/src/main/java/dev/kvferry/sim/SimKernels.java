package dev.kvferry.sim;

import dev.kvferry.rdma.cuda.Cuda;
import dev.kvferry.rdma.cuda.CudaKernels;
import dev.kvferry.rdma.cuda.CudaStream;
import dev.kvferry.rdma.cuda.KernelArgs;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;

/**
 * The simulated engine's and the GPU benches' kernels (src/main/cuda/sim_kernels.cu), loaded from
 * the committed PTX into one device's primary context: a pattern fill and check per block, and the
 * KV fill and check of {@link GpuKvCache}. Kept out of rdma-jni, whose only kernel is the
 * transport's scatter copy. One instance per device.
 */
public final class SimKernels {

  static final String PTX_RESOURCE = "/dev/kvferry/sim/sim_kernels.ptx";
  private static final Map<Integer, SimKernels> BY_DEVICE = new ConcurrentHashMap<>();

  private final int device;
  private final long module;
  private final long fillPattern;
  private final long verifyPattern;
  private final int multiProcessors;
  private final KernelArgs patternArgs = new KernelArgs(7);
  private final Map<String, Long> functions = new ConcurrentHashMap<>();

  private SimKernels(int device) {
    this.device = device;
    Cuda.setDevice(device);
    this.module = Cuda.moduleLoadData(ptx());
    this.fillPattern = Cuda.moduleGetFunction(module, "kvferry_fill_pattern");
    this.verifyPattern = Cuda.moduleGetFunction(module, "kvferry_verify_pattern");
    this.multiProcessors = Cuda.multiProcessorCount(device);
  }

  /** The kernels loaded on {@code device}, loading them on first use. */
  public static SimKernels forDevice(int device) {
    Cuda.require();
    return BY_DEVICE.computeIfAbsent(device, SimKernels::new);
  }

  static byte[] ptx() {
    return CudaKernels.ptx(SimKernels.class, PTX_RESOURCE);
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
