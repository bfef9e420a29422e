package dev.kvferry.rdma.cuda;

/**
 * This host cannot run kvferry's CUDA path: no CUDA runtime or driver library, no GPU, or a driver
 * too old. The message reads {@code CUDA not available: <reason>}; everything that does not need a
 * GPU keeps working.
 */
public final class CudaUnavailableException extends RuntimeException {
  private static final long serialVersionUID = 1L;

  public CudaUnavailableException(String reason) {
    super("CUDA not available: " + reason);
  }
}
