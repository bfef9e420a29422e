package dev.kvferry.rdma.cuda;

/**
 * A CUDA event of one device: recorded on a stream after some work, it completes when that work
 * is done. Streams wait for it on the GPU ({@link CudaStream#waitFor}); the CPU learns of it by
 * polling ({@link #isComplete}, {@link CudaEventPoller}), never by blocking a thread.
 */
public final class CudaEvent implements AutoCloseable {
  private final long handle;
  private final int device;
  private final boolean timing;
  private volatile boolean closed;

  private CudaEvent(long handle, int device, boolean timing) {
    this.handle = handle;
    this.device = device;
    this.timing = timing;
  }

  /** A new event on {@code device}; {@code timing} events can also be measured between. */
  public static CudaEvent create(int device, boolean timing) {
    Cuda.setDevice(device);
    return new CudaEvent(Cuda.eventCreate(timing), device, timing);
  }

  /**
   * An event another process created and shared (cudaIpcEventHandle_t), opened here on {@code
   * device}; closing it releases this process's reference only.
   */
  public static CudaEvent openIpc(int device, byte[] ipcHandle) {
    Cuda.setDevice(device);
    return new CudaEvent(Cuda.ipcOpenEventHandle(ipcHandle), device, false);
  }

  /**
   * A new event on {@code device} that other processes can open from {@link #ipcHandle} and make
   * their streams wait for (no timing: CUDA refuses interprocess events with timing).
   */
  public static CudaEvent createInterprocess(int device) {
    Cuda.setDevice(device);
    return new CudaEvent(Cuda.eventCreateInterprocess(), device, false);
  }

  /** The 64-byte cudaIpcEventHandle_t of an event made by {@link #createInterprocess}. */
  public byte[] ipcHandle() {
    Cuda.setDevice(device);
    return Cuda.ipcGetEventHandle(handle);
  }

  public long handle() {
    return handle;
  }

  public int device() {
    return device;
  }

  /** Records the event after the work already queued on {@code stream}. */
  public CudaEvent record(CudaStream stream) {
    Cuda.eventRecord(handle, stream.handle());
    return this;
  }

  /** True once the work before the last record is done (true for a never-recorded event). */
  public boolean isComplete() {
    return Cuda.eventQuery(handle);
  }

  /** Milliseconds from {@code earlier} to this event; both must be timing events and complete. */
  public float elapsedMsSince(CudaEvent earlier) {
    if (!timing || !earlier.timing) {
      throw new IllegalStateException("elapsed time needs two timing events");
    }
    return Cuda.eventElapsedMs(earlier.handle, handle);
  }

  /** True once {@link #close} ran; read under the event's monitor to use it without a race. */
  public boolean isClosed() {
    return closed;
  }

  /**
   * Destroys the event (for an opened IPC event, this process's reference). Synchronized: code
   * that records it while holding its monitor and checking {@link #isClosed} never records a
   * destroyed event.
   */
  @Override
  public synchronized void close() {
    if (!closed) {
      closed = true;
      Cuda.eventDestroy(handle);
    }
  }
}
