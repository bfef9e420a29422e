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

  public record NewRequest(String requestId, int[] blockIds) {}

  public record CachedRequest(String requestId, int[] newBlockIds) {}
}
