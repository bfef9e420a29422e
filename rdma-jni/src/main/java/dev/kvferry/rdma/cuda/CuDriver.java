package dev.kvferry.rdma.cuda;

import com.sun.jna.Native;
import com.sun.jna.NativeLibrary;
import java.util.List;

/**
 * The CUDA driver API ({@code libcuda}) through JNA's direct mapping, for what the runtime API
 * cannot do from Java: loading PTX, launching kernels by handle, and finding an allocation's base.
 * Driver calls use the thread's current context, the device's primary context that {@code
 * cudaSetDevice} makes current. Every function returns a CUresult that {@link Cuda} checks.
 */
final class CuDriver {
  static final NativeLibrary LIBRARY;

  static {
    LIBRARY = Cuda.load("cuda", "kvferry.cuda.libcuda", List.of("libcuda.so.1", "cuda"));
    Native.register(CuDriver.class, LIBRARY);
  }

  private CuDriver() {}

  static native int cuInit(int flags);

  static native int cuGetErrorName(int error, long[] name);

  static native int cuDeviceGetName(byte[] name, int length, int device);

  /** cuDeviceGetUuid_v2 (CUDA 11.4+): the device's 16-byte UUID, as nvidia-smi shows it. */
  static native int cuDeviceGetUuid_v2(byte[] uuid, int device);

  static native int cuModuleLoadData(long[] module, byte[] image);

  static native int cuModuleUnload(long module);

  static native int cuModuleGetFunction(long[] function, long module, String name);

  static native int cuLaunchKernel(
      long function,
      int gridX,
      int gridY,
      int gridZ,
      int blockX,
      int blockY,
      int blockZ,
      int sharedMemBytes,
      long stream,
      long kernelParams,
      long extra);

  /**
   * cuStreamWriteValue64 (the _v2 ABI name, CUDA 11.7+): a stream-ordered store of one word,
   * flushed after the work queued before it (flags 0), to device or mapped host memory.
   */
  static native int cuStreamWriteValue64_v2(long stream, long address, long value, int flags);

  /**
   * cuStreamWaitValue64 (the _v2 ABI name, CUDA 11.7+): the stream waits until the word at
   * {@code address} is at least {@code value} (flags 0: CU_STREAM_WAIT_VALUE_GEQ).
   */
  static native int cuStreamWaitValue64_v2(long stream, long address, long value, int flags);

  /** cuMemGetAddressRange, whose ABI name since CUDA 3.2 is the _v2 one. */
  static native int cuMemGetAddressRange_v2(long[] base, long[] size, long devPtr);
}
