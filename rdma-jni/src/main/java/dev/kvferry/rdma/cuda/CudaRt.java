package dev.kvferry.rdma.cuda;

import com.sun.jna.Native;
import com.sun.jna.NativeLibrary;
import com.sun.jna.Structure;
import java.util.List;

/**
 * The CUDA runtime API ({@code libcudart}) through JNA's direct mapping: no reflection or boxing per
 * call, pointers and handles as {@code long}, out-parameters as one-element primitive arrays. Every
 * function returns a cudaError_t that {@link Cuda} checks. Registered on first use of the class, so
 * a host without the library fails only when CUDA is asked for.
 */
final class CudaRt {
  static final int SUCCESS = 0;
  static final int ERROR_NOT_READY = 600;

  static final int MEMCPY_HOST_TO_DEVICE = 1;
  static final int MEMCPY_DEVICE_TO_HOST = 2;
  static final int MEMCPY_DEVICE_TO_DEVICE = 3;
  static final int MEMCPY_DEFAULT = 4;

  static final int STREAM_NON_BLOCKING = 0x01;
  static final int EVENT_DISABLE_TIMING = 0x02;
  static final int EVENT_INTERPROCESS = 0x04;
  static final int IPC_MEM_LAZY_ENABLE_PEER_ACCESS = 0x01;
  static final int HOST_ALLOC_DEFAULT = 0x00;
  static final int DEV_ATTR_MULTIPROCESSOR_COUNT = 16;
  static final int ERROR_PEER_ACCESS_ALREADY_ENABLED = 704;

  static final NativeLibrary LIBRARY;

  static {
    LIBRARY = Cuda.load("cudart", "kvferry.cuda.cudart", List.of("cudart", "libcudart.so.13", "libcudart.so.12"));
    Native.register(CudaRt.class, LIBRARY);
  }

  private CudaRt() {}

  /** cudaIpcMemHandle_t, passed by value to cudaIpcOpenMemHandle. */
  @Structure.FieldOrder("reserved")
  public static final class IpcMemHandle extends Structure implements Structure.ByValue {
    public byte[] reserved = new byte[Cuda.IPC_HANDLE_BYTES];
  }

  /** cudaIpcEventHandle_t, passed by value to cudaIpcOpenEventHandle. */
  @Structure.FieldOrder("reserved")
  public static final class IpcEventHandle extends Structure implements Structure.ByValue {
    public byte[] reserved = new byte[Cuda.IPC_HANDLE_BYTES];
  }

  static native String cudaGetErrorName(int error);

  static native int cudaRuntimeGetVersion(int[] version);

  static native int cudaDriverGetVersion(int[] version);

  static native int cudaGetDeviceCount(int[] count);

  static native int cudaSetDevice(int device);

  static native int cudaGetDevice(int[] device);

  static native int cudaDeviceGetAttribute(int[] value, int attribute, int device);

  static native int cudaDeviceSynchronize();

  static native int cudaMalloc(long[] devPtr, long size);

  static native int cudaFree(long devPtr);

  static native int cudaHostAlloc(long[] ptr, long size, int flags);

  static native int cudaFreeHost(long ptr);

  static final int HOST_REGISTER_PORTABLE = 0x01;
  static final int HOST_REGISTER_MAPPED = 0x02;

  static native int cudaHostRegister(long ptr, long size, int flags);

  static native int cudaHostUnregister(long ptr);

  static native int cudaHostGetDevicePointer(long[] devPtr, long hostPtr, int flags);

  static native int cudaMemset(long devPtr, int value, long count);

  static native int cudaMemsetAsync(long devPtr, int value, long count, long stream);

  static native int cudaMemcpy(long dst, long src, long count, int kind);

  static native int cudaMemcpyAsync(long dst, long src, long count, int kind, long stream);

  static native int cudaMemcpyPeerAsync(
      long dst, int dstDevice, long src, int srcDevice, long count, long stream);

  static native int cudaStreamCreateWithFlags(long[] stream, int flags);

  static native int cudaStreamDestroy(long stream);

  static native int cudaStreamSynchronize(long stream);

  static native int cudaStreamWaitEvent(long stream, long event, int flags);

  static native int cudaEventCreateWithFlags(long[] event, int flags);

  static native int cudaEventDestroy(long event);

  static native int cudaEventRecord(long event, long stream);

  static native int cudaEventQuery(long event);

  static native int cudaEventSynchronize(long event);

  static native int cudaEventElapsedTime(float[] ms, long start, long end);

  static native int cudaIpcGetMemHandle(byte[] handle, long devPtr);

  static native int cudaIpcOpenMemHandle(long[] devPtr, IpcMemHandle handle, int flags);

  static native int cudaIpcCloseMemHandle(long devPtr);

  static native int cudaIpcGetEventHandle(byte[] handle, long event);

  static native int cudaIpcOpenEventHandle(long[] event, IpcEventHandle handle);

  static native int cudaDeviceCanAccessPeer(int[] canAccess, int device, int peerDevice);

  static native int cudaDeviceEnablePeerAccess(int peerDevice, int flags);

  static native int cudaGetLastError();
}
