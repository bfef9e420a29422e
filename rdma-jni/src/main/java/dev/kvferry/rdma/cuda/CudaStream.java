package dev.kvferry.rdma.cuda;

/** A non-blocking CUDA stream of one device (it never waits on the legacy default stream). */
public final class CudaStream implements AutoCloseable {
  private final long handle;
  private final int device;
  private volatile boolean closed;

  private CudaStream(long handle, int device) {
    this.handle = handle;
    this.device = device;
  }

  public static CudaStream create(int device) {
    Cuda.setDevice(device);
    return new CudaStream(Cuda.streamCreate(), device);
  }

  public long handle() {
    return handle;
  }

  public int device() {
    return device;
  }

  /** Orders all work queued on this stream from now on behind {@code event}; returns at once. */
  public void waitFor(CudaEvent event) {
    Cuda.streamWaitEvent(handle, event.handle());
  }

  /** Blocks the calling thread until the stream's queued work is done: for tests and benches. */
  public void synchronize() {
    Cuda.streamSynchronize(handle);
  }

  @Override
  public void close() {
    if (!closed) {
      closed = true;
      Cuda.streamDestroy(handle);
    }
  }
}
