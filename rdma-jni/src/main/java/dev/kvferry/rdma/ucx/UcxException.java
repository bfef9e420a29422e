package dev.kvferry.rdma.ucx;

/** A UCX call returned an error: the message names the call and the status (ucs_status_string). */
public final class UcxException extends RuntimeException {
  private static final long serialVersionUID = 1L;

  private final String call;
  private final int status;

  public UcxException(String call, int status, String statusText) {
    super(call + " failed: " + statusText + " (" + status + ")");
    this.call = call;
    this.status = status;
  }

  /** The UCX function that failed, e.g. {@code ucp_ep_create}. */
  public String call() {
    return call;
  }

  /** The numeric ucs_status_t. */
  public int status() {
    return status;
  }
}
