package dev.kvferry.node;

import dev.kvferry.actors.TransferObserver;

/**
 * Prometheus metrics of one kvferry process. TEMPORARY minimal version: the management work
 * replaces the body with a Prometheus-backed implementation (counters for bytes, transfers by
 * outcome, failures; latency histograms).
 */
public final class NodeMetrics implements TransferObserver {

  @Override
  public void transferEnded(Outcome outcome, long bytes, long durationNanos) {}

  /** The metrics in Prometheus text exposition format. */
  public String scrape() {
    return "";
  }
}
