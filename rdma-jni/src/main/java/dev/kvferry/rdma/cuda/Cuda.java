package dev.kvferry.rdma.cuda;

import com.sun.jna.Function;
import com.sun.jna.NativeLibrary;
import com.sun.jna.Pointer;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import org.jspecify.annotations.Nullable;

/**
 * kvferry's entry to CUDA: the availability probe, and checked wrappers over the runtime and driver
 * calls the data plane uses. Every wrapper checks the return code and throws {@link CudaException}
 * naming the call and the error; every one first throws {@link CudaUnavailableException} when the
 * probe failed. Pointers, streams, events and modules travel as {@code long} handles.
 *
 * <p>Calls act on the calling thread's current device: call {@link #setDevice} first on any thread
 * that is not known to have it (it is cheap when already current).
 */
public final class Cuda {

  /** Bytes of a cudaIpcMemHandle_t. */
  public static final int IPC_HANDLE_BYTES = 64;

  private static final @Nullable String UNAVAILABLE;
  private static final int RUNTIME_VERSION;
  private static final @Nullable Function MEMCPY_BATCH_ASYNC;

  static {
    String reason = null;
    int runtimeVersion = 0;
    Function batch = null;
    try {
      int[] v = new int[1];
      int rc = CudaRt.cudaRuntimeGetVersion(v);
      runtimeVersion = v[0];
      if (rc != CudaRt.SUCCESS) {
        reason = "cudaRuntimeGetVersion failed: " + CudaRt.cudaGetErrorName(rc);
      } else {
        int drc = CuDriver.cuInit(0);
        if (drc != 0) {
          reason = "cuInit failed: " + driverErrorName(drc) + " (" + drc + ")";
        } else {
          int[] n = new int[1];
          rc = CudaRt.cudaGetDeviceCount(n);
          if (rc != CudaRt.SUCCESS) {
            reason = "cudaGetDeviceCount failed: " + CudaRt.cudaGetErrorName(rc);
          } else if (n[0] == 0) {
            reason = "no CUDA device is visible";
          }
        }
      }
      try {
        batch = CudaRt.LIBRARY.getFunction("cudaMemcpyBatchAsync");
      } catch (UnsatisfiedLinkError e) {
        batch = null; // runtime older than 12.8: the scatter kernel still works
      }
    } catch (UnsatisfiedLinkError | NoClassDefFoundError e) {
      reason = e.getMessage() == null ? e.toString() : e.getMessage().lines().findFirst().orElse("");
    } catch (RuntimeException | ExceptionInInitializerError e) {
      Throwable cause = e.getCause() != null ? e.getCause() : e;
      reason = cause.toString();
    }
    UNAVAILABLE = reason;
    RUNTIME_VERSION = runtimeVersion;
    MEMCPY_BATCH_ASYNC = batch;
  }

  private Cuda() {}

  /** True when the CUDA runtime and driver load and at least one GPU is visible. */
  public static boolean available() {
    return UNAVAILABLE == null;
  }

  /** Why CUDA is unavailable, or null when it is available. */
  public static @Nullable String unavailableReason() {
    return UNAVAILABLE;
  }

  /** @throws CudaUnavailableException with the probe's reason unless {@link #available()} */
  public static void require() {
    if (UNAVAILABLE != null) {
      throw new CudaUnavailableException(UNAVAILABLE);
    }
  }

  /** The runtime's version as CUDA encodes it (12080 for 12.8, 13000 for 13.0). */
  public static int runtimeVersion() {
    require();
    return RUNTIME_VERSION;
  }

  /** True when this runtime has cudaMemcpyBatchAsync (12.8 and later). */
  public static boolean hasMemcpyBatch() {
    return available() && MEMCPY_BATCH_ASYNC != null;
  }

  // ---- loading and error names -------------------------------------------------------------

  /**
   * Loads a CUDA library: the path in system property {@code property} if set, else the first of
   * {@code names} the dynamic loader finds.
   */
  static NativeLibrary load(String what, String property, List<String> names) {
    String path = System.getProperty(property);
    List<String> tried = new ArrayList<>();
    List<String> candidates = path != null && !path.isBlank() ? List.of(path) : names;
    for (String name : candidates) {
      try {
        return NativeLibrary.getInstance(name);
      } catch (UnsatisfiedLinkError e) {
        tried.add(name);
      }
    }
    throw new UnsatisfiedLinkError(
        "lib" + what + " not found (tried " + String.join(", ", tried) + "; set -D" + property
            + "=/path/to/lib or the loader path)");
  }

  static String driverErrorName(int code) {
    try {
      long[] p = new long[1];
      if (CuDriver.cuGetErrorName(code, p) == 0 && p[0] != 0) {
        return new Pointer(p[0]).getString(0, StandardCharsets.US_ASCII.name());
      }
    } catch (RuntimeException | UnsatisfiedLinkError e) {
      // fall through to the number
    }
    return "CUresult " + code;
  }

  static void check(String call, int code) {
    if (code != CudaRt.SUCCESS) {
      throw new CudaException(call, code, CudaRt.cudaGetErrorName(code));
    }
  }

  static void checkDriver(String call, int code) {
    if (code != 0) {
      throw new CudaException(call, code, driverErrorName(code));
    }
  }

  // ---- devices --------------------------------------------------------------------------------

  /**
   * Checks that this host can run CUDA work on {@code device}.
   *
   * @throws CudaUnavailableException ("CUDA not available: ...") without CUDA
   * @throws IllegalArgumentException when this host has no GPU {@code device}
   */
  public static void requireDevice(int device) {
    require();
    int n = deviceCount();
    if (device < 0 || device >= n) {
      throw new IllegalArgumentException("GPU " + device + " does not exist: this host has " + n
          + " CUDA device" + (n == 1 ? " (0)" : "s (0-" + (n - 1) + ")"));
    }
  }

  public static int deviceCount() {
    require();
    int[] n = new int[1];
    check("cudaGetDeviceCount", CudaRt.cudaGetDeviceCount(n));
    return n[0];
  }

  /** Makes {@code device} (and its primary context) current on the calling thread. */
  public static void setDevice(int device) {
    require();
    check("cudaSetDevice", CudaRt.cudaSetDevice(device));
  }

  public static int currentDevice() {
    require();
    int[] d = new int[1];
    check("cudaGetDevice", CudaRt.cudaGetDevice(d));
    return d[0];
  }

  public static String deviceName(int device) {
    require();
    byte[] name = new byte[256];
    checkDriver("cuDeviceGetName", CuDriver.cuDeviceGetName(name, name.length, device));
    int n = 0;
    while (n < name.length && name[n] != 0) {
      n++;
    }
    return new String(name, 0, n, StandardCharsets.US_ASCII);
  }

  /**
   * The device's UUID as nvidia-smi prints it ({@code GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx}):
   * the name of a GPU that holds across processes, where device ids do not
   * ({@code CUDA_VISIBLE_DEVICES}).
   */
  public static String deviceUuid(int device) {
    require();
    byte[] u = new byte[16];
    checkDriver("cuDeviceGetUuid_v2", CuDriver.cuDeviceGetUuid_v2(u, device));
    StringBuilder b = new StringBuilder("GPU-");
    for (int i = 0; i < 16; i++) {
      if (i == 4 || i == 6 || i == 8 || i == 10) {
        b.append('-');
      }
      b.append(String.format("%02x", u[i] & 0xff));
    }
    return b.toString();
  }

  public static int multiProcessorCount(int device) {
    require();
    int[] v = new int[1];
    check(
        "cudaDeviceGetAttribute",
        CudaRt.cudaDeviceGetAttribute(v, CudaRt.DEV_ATTR_MULTIPROCESSOR_COUNT, device));
    return v[0];
  }

  public static void deviceSynchronize() {
    require();
    check("cudaDeviceSynchronize", CudaRt.cudaDeviceSynchronize());
  }

  /** True when kernels on {@code device} can reach memory of {@code peer} directly. */
  public static boolean canAccessPeer(int device, int peer) {
    require();
    int[] can = new int[1];
    check("cudaDeviceCanAccessPeer", CudaRt.cudaDeviceCanAccessPeer(can, device, peer));
    return can[0] != 0;
  }

  /** Lets the current device reach {@code peer}'s memory; enabling twice is not an error. */
  public static void enablePeerAccess(int peer) {
    require();
    int rc = CudaRt.cudaDeviceEnablePeerAccess(peer, 0);
    if (rc == CudaRt.ERROR_PEER_ACCESS_ALREADY_ENABLED) {
      CudaRt.cudaGetLastError(); // clear the sticky-until-read error
      return;
    }
    check("cudaDeviceEnablePeerAccess", rc);
  }

  // ---- memory ---------------------------------------------------------------------------------

  /** cudaMalloc on the current device. */
  public static long malloc(long bytes) {
    require();
    long[] p = new long[1];
    check("cudaMalloc", CudaRt.cudaMalloc(p, bytes));
    return p[0];
  }

  public static void free(long devicePtr) {
    require();
    check("cudaFree", CudaRt.cudaFree(devicePtr));
  }

  /** Page-locked host memory: copies from it run truly asynchronously. */
  public static long hostAlloc(long bytes) {
    require();
    long[] p = new long[1];
    check("cudaHostAlloc", CudaRt.cudaHostAlloc(p, bytes, CudaRt.HOST_ALLOC_DEFAULT));
    return p[0];
  }

  public static void freeHost(long hostPtr) {
    require();
    check("cudaFreeHost", CudaRt.cudaFreeHost(hostPtr));
  }

  /**
   * Page-locks existing host memory (a shared mapping, say) for every device and maps it into
   * their address space; returns the address the GPUs use for it.
   */
  public static long hostRegisterMapped(long hostPtr, long bytes) {
    require();
    check("cudaHostRegister",
        CudaRt.cudaHostRegister(hostPtr, bytes,
            CudaRt.HOST_REGISTER_PORTABLE | CudaRt.HOST_REGISTER_MAPPED));
    long[] d = new long[1];
    check("cudaHostGetDevicePointer", CudaRt.cudaHostGetDevicePointer(d, hostPtr, 0));
    return d[0];
  }

  public static void hostUnregister(long hostPtr) {
    check("cudaHostUnregister", CudaRt.cudaHostUnregister(hostPtr));
  }

  /**
   * Queues on {@code stream} a store of {@code value} to {@code devicePtr} (device memory or
   * mapped host memory), made after everything queued before it on the stream and with their
   * writes flushed first, so whoever sees the value also sees those writes.
   */
  public static void streamWriteValue64(long stream, long devicePtr, long value) {
    checkDriver("cuStreamWriteValue64",
        CuDriver.cuStreamWriteValue64_v2(stream, devicePtr, value, 0));
  }

  /**
   * Makes {@code stream} wait, on the GPU, until the word at {@code devicePtr} (device memory or
   * mapped host memory) is at least {@code value}: work queued behind it runs only then.
   */
  public static void streamWaitValue64(long stream, long devicePtr, long value) {
    checkDriver("cuStreamWaitValue64",
        CuDriver.cuStreamWaitValue64_v2(stream, devicePtr, value, 0));
  }

  public static void memset(long devicePtr, int value, long bytes) {
    require();
    check("cudaMemset", CudaRt.cudaMemset(devicePtr, value, bytes));
  }

  public static void memsetAsync(long devicePtr, int value, long bytes, long stream) {
    check("cudaMemsetAsync", CudaRt.cudaMemsetAsync(devicePtr, value, bytes, stream));
  }

  /** Synchronous copy between any two addresses (unified addressing works out the direction). */
  public static void memcpy(long dst, long src, long bytes) {
    require();
    check("cudaMemcpy", CudaRt.cudaMemcpy(dst, src, bytes, CudaRt.MEMCPY_DEFAULT));
  }

  public static void memcpyAsync(long dst, long src, long bytes, long stream) {
    check("cudaMemcpyAsync", CudaRt.cudaMemcpyAsync(dst, src, bytes, CudaRt.MEMCPY_DEFAULT, stream));
  }

  public static void memcpyPeerAsync(
      long dst, int dstDevice, long src, int srcDevice, long bytes, long stream) {
    check(
        "cudaMemcpyPeerAsync",
        CudaRt.cudaMemcpyPeerAsync(dst, dstDevice, src, srcDevice, bytes, stream));
  }

  /**
   * cudaMemcpyBatchAsync (CUDA 12.8+): {@code count} copies in one call, described by native
   * arrays of destinations, sources and sizes (8 bytes each), with one attribute block (24 bytes:
   * the source access order "stream", no location hints, {@code flags}). The copies run in stream
   * order; among themselves in any order.
   */
  public static void memcpyBatchAsync(
      Pointer dsts, Pointer srcs, Pointer sizes, long count, Pointer attrs, Pointer attrIdx,
      long stream) {
    if (MEMCPY_BATCH_ASYNC == null) {
      throw new CudaUnavailableException(
          "cudaMemcpyBatchAsync needs CUDA 12.8 or later; this runtime is " + RUNTIME_VERSION);
    }
    int rc;
    if (RUNTIME_VERSION >= 13000) {
      rc = MEMCPY_BATCH_ASYNC.invokeInt(
          new Object[] {dsts, srcs, sizes, count, attrs, attrIdx, 1L, stream});
    } else {
      // 12.8/12.9 take a failIdx out-parameter before the stream.
      long[] failIdx = new long[1];
      rc = MEMCPY_BATCH_ASYNC.invokeInt(
          new Object[] {dsts, srcs, sizes, count, attrs, attrIdx, 1L, failIdx, stream});
    }
    check("cudaMemcpyBatchAsync", rc);
  }

  /**
   * The allocation that {@code devicePtr} lies in: {@code [base, base + size)}. IPC handles name
   * allocations, so a region inside one travels as (handle of the base, offset).
   */
  public static long[] allocationRange(long devicePtr) {
    require();
    long[] base = new long[1];
    long[] size = new long[1];
    checkDriver("cuMemGetAddressRange", CuDriver.cuMemGetAddressRange_v2(base, size, devicePtr));
    return new long[] {base[0], size[0]};
  }

  // ---- IPC ------------------------------------------------------------------------------------

  /** The 64-byte IPC handle of the allocation whose base is {@code allocationBase}. */
  public static byte[] ipcGetMemHandle(long allocationBase) {
    require();
    byte[] handle = new byte[IPC_HANDLE_BYTES];
    check("cudaIpcGetMemHandle", CudaRt.cudaIpcGetMemHandle(handle, allocationBase));
    return handle;
  }

  /**
   * Maps another process's allocation into this one, on the current device (peer access is
   * enabled lazily when the allocation lives on another GPU). Close with {@link #ipcCloseMemHandle}.
   */
  public static long ipcOpenMemHandle(byte[] handle) {
    require();
    if (handle == null || handle.length != IPC_HANDLE_BYTES) {
      throw new IllegalArgumentException(
          "a CUDA IPC handle has " + IPC_HANDLE_BYTES + " bytes, got "
              + (handle == null ? "none" : handle.length));
    }
    CudaRt.IpcMemHandle h = new CudaRt.IpcMemHandle();
    System.arraycopy(handle, 0, h.reserved, 0, IPC_HANDLE_BYTES);
    long[] p = new long[1];
    check(
        "cudaIpcOpenMemHandle",
        CudaRt.cudaIpcOpenMemHandle(p, h, CudaRt.IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
    return p[0];
  }

  public static void ipcCloseMemHandle(long devicePtr) {
    require();
    check("cudaIpcCloseMemHandle", CudaRt.cudaIpcCloseMemHandle(devicePtr));
  }

  /**
   * Opens another process's interprocess event (created with cudaEventInterprocess and
   * cudaEventDisableTiming) on the current device; streams of this process can wait for it and it
   * can be queried. Release it with {@link #eventDestroy}.
   */
  public static long ipcOpenEventHandle(byte[] handle) {
    require();
    if (handle == null || handle.length != IPC_HANDLE_BYTES) {
      throw new IllegalArgumentException(
          "a CUDA IPC event handle has " + IPC_HANDLE_BYTES + " bytes, got "
              + (handle == null ? "none" : handle.length));
    }
    CudaRt.IpcEventHandle h = new CudaRt.IpcEventHandle();
    System.arraycopy(handle, 0, h.reserved, 0, IPC_HANDLE_BYTES);
    long[] e = new long[1];
    check("cudaIpcOpenEventHandle", CudaRt.cudaIpcOpenEventHandle(e, h));
    return e[0];
  }

  /**
   * The 64-byte IPC handle of {@code event}, which must have been made by {@link
   * #eventCreateInterprocess}; another process opens it with cudaIpcOpenEventHandle.
   */
  public static byte[] ipcGetEventHandle(long event) {
    require();
    byte[] handle = new byte[IPC_HANDLE_BYTES];
    check("cudaIpcGetEventHandle", CudaRt.cudaIpcGetEventHandle(handle, event));
    return handle;
  }

  // ---- streams and events -----------------------------------------------------------------------

  /** A stream that does not synchronize with the legacy default stream. */
  public static long streamCreate() {
    require();
    long[] s = new long[1];
    check("cudaStreamCreateWithFlags", CudaRt.cudaStreamCreateWithFlags(s, CudaRt.STREAM_NON_BLOCKING));
    return s[0];
  }

  public static void streamDestroy(long stream) {
    check("cudaStreamDestroy", CudaRt.cudaStreamDestroy(stream));
  }

  public static void streamSynchronize(long stream) {
    check("cudaStreamSynchronize", CudaRt.cudaStreamSynchronize(stream));
  }

  /** Orders all later work of {@code stream} behind {@code event}; the CPU does not wait. */
  public static void streamWaitEvent(long stream, long event) {
    check("cudaStreamWaitEvent", CudaRt.cudaStreamWaitEvent(stream, event, 0));
  }

  /** An event; with {@code timing} false it is cheaper to record and query. */
  public static long eventCreate(boolean timing) {
    require();
    long[] e = new long[1];
    check(
        "cudaEventCreateWithFlags",
        CudaRt.cudaEventCreateWithFlags(e, timing ? 0 : CudaRt.EVENT_DISABLE_TIMING));
    return e[0];
  }

  /**
   * An event other processes can open ({@link #ipcGetEventHandle}) and wait for; CUDA requires
   * interprocess events to be created without timing.
   */
  public static long eventCreateInterprocess() {
    require();
    long[] e = new long[1];
    check(
        "cudaEventCreateWithFlags",
        CudaRt.cudaEventCreateWithFlags(
            e, CudaRt.EVENT_DISABLE_TIMING | CudaRt.EVENT_INTERPROCESS));
    return e[0];
  }

  public static void eventDestroy(long event) {
    check("cudaEventDestroy", CudaRt.cudaEventDestroy(event));
  }

  public static void eventRecord(long event, long stream) {
    check("cudaEventRecord", CudaRt.cudaEventRecord(event, stream));
  }

  /** True once the work before the event's last record is done; false while it is pending. */
  public static boolean eventQuery(long event) {
    int rc = CudaRt.cudaEventQuery(event);
    if (rc == CudaRt.ERROR_NOT_READY) {
      return false;
    }
    check("cudaEventQuery", rc);
    return true;
  }

  public static void eventSynchronize(long event) {
    check("cudaEventSynchronize", CudaRt.cudaEventSynchronize(event));
  }

  /** Milliseconds between two completed timing events. */
  public static float eventElapsedMs(long start, long end) {
    float[] ms = new float[1];
    check("cudaEventElapsedTime", CudaRt.cudaEventElapsedTime(ms, start, end));
    return ms[0];
  }

  // ---- modules and kernels ----------------------------------------------------------------------

  /** Loads PTX (or a cubin) into the current device's primary context. */
  public static long moduleLoadData(byte[] image) {
    require();
    byte[] terminated = image;
    if (image.length == 0 || image[image.length - 1] != 0) {
      terminated = java.util.Arrays.copyOf(image, image.length + 1); // PTX must end in NUL
    }
    long[] m = new long[1];
    checkDriver("cuModuleLoadData", CuDriver.cuModuleLoadData(m, terminated));
    return m[0];
  }

  public static void moduleUnload(long module) {
    checkDriver("cuModuleUnload", CuDriver.cuModuleUnload(module));
  }

  public static long moduleGetFunction(long module, String name) {
    long[] f = new long[1];
    checkDriver("cuModuleGetFunction(" + name + ")", CuDriver.cuModuleGetFunction(f, module, name));
    return f[0];
  }

  /**
   * Launches {@code function} on {@code stream}. {@code kernelParams} is a native array of
   * pointers, one per kernel parameter, each to the parameter's value (see {@link KernelArgs}).
   */
  public static void launchKernel(
      long function, int gridX, int blockX, int sharedMemBytes, long stream, long kernelParams) {
    checkDriver(
        "cuLaunchKernel",
        CuDriver.cuLaunchKernel(function, gridX, 1, 1, blockX, 1, 1, sharedMemBytes, stream,
            kernelParams, 0));
  }
}
