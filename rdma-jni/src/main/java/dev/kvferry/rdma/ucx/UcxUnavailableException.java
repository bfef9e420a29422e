package dev.kvferry.rdma.ucx;

/**
 * This host cannot run the ucx transport: libucp missing (Debian: {@code apt-get install libucx0})
 * or older than kvferry needs. The message reads {@code UCX not available: <reason>}; the other
 * transports keep working.
 */
public final class UcxUnavailableException extends RuntimeException {
  private static final long serialVersionUID = 1L;

  public UcxUnavailableException(String reason) {
    super("UCX not available: " + reason);
  }
}
