package dev.kvferry.rdma.cuda;

/** A CUDA call returned an error: the message names the call and the error (cudaGetErrorName). */
public final class CudaException extends RuntimeException {
  private static final long serialVersionUID = 1L;

  private final String call;
  private final int code;
  private final String errorName;

  public CudaException(String call, int code, String errorName) {
    super(call + " failed: " + errorName + " (" + code + ")");
    this.call = call;
    this.code = code;
    this.errorName = errorName;
  }

  /** The CUDA function that failed, e.g. {@code cudaIpcOpenMemHandle}. */
  public String call() {
    return call;
  }

  /** The numeric cudaError_t or CUresult. */
  public int code() {
    return code;
  }

  /** The symbolic error, e.g. {@code cudaErrorInvalidValue}. */
  public String errorName() {
    return errorName;
  }
}
