package dev.kvferry.actors.connector;

import org.jspecify.annotations.Nullable;

/**
 * Answer of {@code requestFinished}: whether the engine must keep the request's blocks until the
 * connector reports the request in {@code getFinished} (P: done sending; D, a request aborted
 * while its transfer could still copy into its blocks: failed), and the params to hand to the
 * other side (READ mode).
 */
public record FinishDecision(boolean delayFreeBlocks, @Nullable KvTransferParams paramsForPeer) {
  public static final FinishDecision FREE_NOW = new FinishDecision(false, null);
}
