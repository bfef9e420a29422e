package dev.kvferry.engine;

import dev.kvferry.actors.CborSerializable;

/**
 * One request of a simulated workload.
 *
 * @param requestId unique per workload
 * @param promptTokens prompt length
 * @param decodeCachedTokens tokens D already has in its prefix cache (a multiple of D's block
 *     size, below promptTokens); only the rest is transferred
 * @param abort where the request is aborted, if anywhere
 */
public record RequestSpec(String requestId, int promptTokens, int decodeCachedTokens, Abort abort)
    implements CborSerializable {

  /** Where a request is aborted. */
  public enum Abort {
    NONE,
    /** P drops it before scheduling it: D must not wait for writes. */
    PREFILL_BEFORE_SCHEDULE,
    /** P drops it between prefill chunks (or, for a one-chunk prompt, before scheduling). */
    PREFILL_MID,
    /** D drops it before scheduling it: P must free the blocks it kept or would write. */
    DECODE_BEFORE_SCHEDULE
  }
}
