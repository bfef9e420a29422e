package dev.kvferry.demo;

import java.io.IOException;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.time.Duration;
import java.util.HashMap;
import java.util.Map;

/** A node's metrics as the demos read them: its {@code /metrics} text, series to value. */
final class NodeMetricsText {
  private NodeMetricsText() {}

  /**
   * Reads {@code metrics} (a management server's {@code /metrics}); the keys are the series as
   * written, labels included ({@code kvferry_transfers_total{outcome="received"}}).
   */
  static Map<String, Double> read(URI metrics) throws IOException, InterruptedException {
    HttpResponse<String> r = HttpClient.newHttpClient().send(
        HttpRequest.newBuilder(metrics).timeout(Duration.ofSeconds(10)).build(),
        HttpResponse.BodyHandlers.ofString());
    Map<String, Double> series = new HashMap<>();
    for (String line : r.body().split("\n")) {
      int space = line.lastIndexOf(' ');
      if (line.startsWith("#") || space <= 0) {
        continue;
      }
      try {
        series.put(line.substring(0, space), Double.parseDouble(line.substring(space + 1)));
      } catch (NumberFormatException e) {
        // not a sample line
      }
    }
    return series;
  }
}
