package dev.kvferry.actors.connector;

import java.util.List;

/**
 * What the engine's scheduler decided this step, as far as the connector needs it.
 *
 * @param scheduledNewReqs requests scheduled for the first time, with all their blocks so far
 * @param scheduledCachedReqs requests scheduled again (a later prefill chunk), with blocks added
 */
public record SchedulerOutput(List<NewRequest> scheduledNewReqs, List<CachedRequest> scheduledCachedReqs) {

  public SchedulerOutput {
    scheduledNewReqs = List.copyOf(scheduledNewReqs);
    scheduledCachedReqs = List.copyOf(scheduledCachedReqs);
  }

  /**
   * @param computedTokensAfterStep prompt tokens computed once this step's forward pass is done, or
   *     -1 if unknown (then the seed's block-count test decides whether this is the last chunk)
   */
  public record NewRequest(String requestId, int[] blockIds, int computedTokensAfterStep) {
    public NewRequest(String requestId, int[] blockIds) {
      this(requestId, blockIds, -1);
    }
  }

  /**
   * A request scheduled again (a later prefill chunk); see {@link NewRequest} for the count.
   *
   * @param resumed the request was preempted and is scheduled again: {@code newBlockIds} are all
   *     its blocks now (vLLM freed the old ones), not blocks added to those it had
   */
  public record CachedRequest(String requestId, int[] newBlockIds, int computedTokensAfterStep,
      boolean resumed) {
    public CachedRequest(String requestId, int[] newBlockIds, int computedTokensAfterStep) {
      this(requestId, newBlockIds, computedTokensAfterStep, false);
    }

    public CachedRequest(String requestId, int[] newBlockIds) {
      this(requestId, newBlockIds, -1);
    }
  }
}
