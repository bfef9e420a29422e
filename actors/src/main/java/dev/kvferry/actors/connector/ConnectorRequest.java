package dev.kvferry.actors.connector;

import org.jspecify.annotations.Nullable;

/**
 * What the connector needs to know of an engine's request. The params are replaced (not mutated)
 * when the connector clears {@code do_remote_prefill} after the first transfer, as the seed does.
 */
public final class ConnectorRequest {

  /** How a request ended, as far as the connector cares. */
  public enum Status {
    RUNNING,
    /** Stopped by the token limit: for P, the normal end of a prefill-only request. */
    FINISHED_LENGTH_CAPPED,
    FINISHED_STOPPED,
    FINISHED_ABORTED
  }

  private final String requestId;
  private final int numPromptTokens;
  private volatile @Nullable KvTransferParams params;
  private volatile Status status = Status.RUNNING;

  public ConnectorRequest(String requestId, int numPromptTokens, @Nullable KvTransferParams params) {
    if (numPromptTokens < 0) {
      throw new IllegalArgumentException("request " + requestId + ": negative prompt length");
    }
    this.requestId = requestId;
    this.numPromptTokens = numPromptTokens;
    this.params = params;
  }

  public String requestId() {
    return requestId;
  }

  public int numPromptTokens() {
    return numPromptTokens;
  }

  /** The kv_transfer_params, or null for a request that uses no remote KV. */
  public @Nullable KvTransferParams params() {
    return params;
  }

  public void setParams(@Nullable KvTransferParams params) {
    this.params = params;
  }

  public Status status() {
    return status;
  }

  public void setStatus(Status status) {
    this.status = status;
  }

  @Override
  public String toString() {
    return "Request[" + requestId + ", " + numPromptTokens + " tokens, " + status + "]";
  }
}
