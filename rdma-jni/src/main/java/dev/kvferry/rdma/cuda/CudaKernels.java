package dev.kvferry.rdma.cuda;

import java.io.IOException;
import java.io.InputStream;
import java.io.UncheckedIOException;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;

/**
 * The transport's kernel (src/main/cuda/kvferry_kernels.cu, the scatter copy) loaded from the
 * committed PTX into one device's primary context with {@code cuModuleLoadData}. One instance per
 * device. The simulated engine's kernels live with it (the sim module's SimKernels).
 */
public final class CudaKernels {

  /** Bytes per chunk of the scatter copy; must match KVF_CHUNK_BYTES in the .cu source. */
  public static final int CHUNK_BYTES = 65536;
  /** Threads per CTA of the scatter copy; must match KVF_COPY_THREADS. */
  public static final int COPY_THREADS = 512;

  static final String PTX_RESOURCE = "/dev/kvferry/rdma/cuda/kvferry_kernels.ptx";
  private static final Map<Integer, CudaKernels> BY_DEVICE = new ConcurrentHashMap<>();

  private final int device;
  private final long scatterCopy;
  private final int multiProcessors;

  private CudaKernels(int device) {
    this.device = device;
    Cuda.setDevice(device);
    long module = Cuda.moduleLoadData(ptx());
    this.scatterCopy = Cuda.moduleGetFunction(module, "kvferry_scatter_copy");
    this.multiProcessors = Cuda.multiProcessorCount(device);
  }

  /** The kernels loaded on {@code device}, loading them on first use. */
  public static CudaKernels forDevice(int device) {
    Cuda.require();
    return BY_DEVICE.computeIfAbsent(device, CudaKernels::new);
  }

  static byte[] ptx() {
    return ptx(CudaKernels.class, PTX_RESOURCE);
  }

  /** A committed PTX module shipped as resource {@code resource} of {@code owner}'s jar. */
  public static byte[] ptx(Class<?> owner, String resource) {
    try (InputStream in = owner.getResourceAsStream(resource)) {
      if (in == null) {
        throw new IllegalStateException("kernel PTX " + resource + " missing from the jar");
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

  /** The scatter-copy function handle (launched by {@link ScatterPlan}). */
  long scatterCopyFunction() {
    return scatterCopy;
  }
}
