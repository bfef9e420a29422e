package dev.kvferry.management;

import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvferry.actors.TransferObserver.Outcome;
import dev.kvferry.node.NodeMetrics;
import java.util.Map;
import org.junit.jupiter.api.Test;

class NodeMetricsTest {

  private final NodeMetrics metrics = new NodeMetrics();

  @Test
  void everyOutcomeIsExposedAtZeroBeforeAnyTransferEnds() {
    String text = metrics.scrape();
    for (String outcome : new String[] {"sent", "received", "failed", "expired"}) {
      assertTrue(text.contains("kvferry_transfers_total{outcome=\"" + outcome + "\"} 0.0"), text);
    }
    assertTrue(text.contains("kvferry_transfer_bytes_total 0.0"), text);
    assertTrue(text.contains("kvferry_transfer_failures_total 0.0"), text);
    assertTrue(text.contains("kvferry_receives_done_by_word_total 0.0"), text);
  }

  @Test
  void countsReceivesTheirDoneWordsReported() {
    metrics.receiveDoneByWord();
    metrics.receiveDoneByWord();
    assertTrue(metrics.scrape().contains("kvferry_receives_done_by_word_total 2.0"));
  }

  @Test
  void countsBytesOutcomesAndFailures() {
    metrics.transferEnded(Outcome.SENT, 1000, 1_000_000);
    metrics.transferEnded(Outcome.SENT, 24, 3_000_000);
    metrics.transferEnded(Outcome.FAILED, 0, 5_000_000);
    metrics.transferEnded(Outcome.EXPIRED, 0, -1);
    String text = metrics.scrape();
    assertTrue(text.contains("kvferry_transfer_bytes_total 1024.0"), text);
    assertTrue(text.contains("kvferry_transfers_total{outcome=\"sent\"} 2.0"), text);
    assertTrue(text.contains("kvferry_transfers_total{outcome=\"failed\"} 1.0"), text);
    assertTrue(text.contains("kvferry_transfers_total{outcome=\"expired\"} 1.0"), text);
    assertTrue(text.contains("kvferry_transfer_failures_total 2.0"), text);
  }

  @Test
  void latencyIsObservedInSecondsOnlyWhenTheDurationIsKnown() {
    metrics.transferEnded(Outcome.SENT, 10, 1_000_000);
    metrics.transferEnded(Outcome.SENT, 10, 3_000_000);
    metrics.transferEnded(Outcome.EXPIRED, 0, -1);
    String text = metrics.scrape();
    assertTrue(text.contains("kvferry_transfer_latency_seconds_count{outcome=\"sent\"} 2"), text);
    assertTrue(text.contains("kvferry_transfer_latency_seconds_sum{outcome=\"sent\"} 0.004"), text);
    assertFalse(text.contains("kvferry_transfer_latency_seconds_count{outcome=\"expired\"}"), text);
  }

  @Test
  void requestLatencyIsAHistogramInSeconds() {
    metrics.requestLatency(0.25);
    String text = metrics.scrape();
    assertTrue(text.contains("# TYPE kvferry_request_latency_seconds histogram"), text);
    assertTrue(text.contains("kvferry_request_latency_seconds_count 1"), text);
    assertTrue(text.contains("kvferry_request_latency_seconds_sum 0.25"), text);
  }

  @Test
  void inFlightStatesThatEmptyGoBackToZero() {
    metrics.transfersInFlight(Map.of("receiving", 3, "awaiting_release", 1));
    metrics.transfersInFlight(Map.of("receiving", 2));
    String text = metrics.scrape();
    assertTrue(text.contains("kvferry_transfers_in_flight{state=\"receiving\"} 2.0"), text);
    assertTrue(text.contains("kvferry_transfers_in_flight{state=\"awaiting_release\"} 0.0"), text);
  }
}
