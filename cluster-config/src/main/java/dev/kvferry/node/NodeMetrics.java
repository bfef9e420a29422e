package dev.kvferry.node;

import dev.kvferry.actors.TransferObserver;
import io.prometheus.metrics.core.metrics.Counter;
import io.prometheus.metrics.core.metrics.Gauge;
import io.prometheus.metrics.core.metrics.Histogram;
import io.prometheus.metrics.expositionformats.PrometheusTextFormatWriter;
import io.prometheus.metrics.model.registry.PrometheusRegistry;
import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.charset.StandardCharsets;
import java.util.HashSet;
import java.util.Locale;
import java.util.Map;
import java.util.Set;

/**
 * Prometheus metrics of one kvferry process, in a registry of its own (not the library-wide default
 * registry, so two nodes in one JVM, as in tests, do not mix their numbers). Thread-safe: workers
 * call {@link #transferEnded} from actor threads.
 *
 * <p>Counters are exposed with the {@code _total} suffix the text format adds; every outcome's
 * series exists from the start at 0, so {@code rate()} works before the first transfer ends.
 */
public final class NodeMetrics implements TransferObserver {

  /** Text format version 0.0.4, the one every Prometheus server reads. */
  public static final String CONTENT_TYPE = PrometheusTextFormatWriter.CONTENT_TYPE;

  private final PrometheusRegistry registry = new PrometheusRegistry();
  private final PrometheusTextFormatWriter writer = PrometheusTextFormatWriter.create();

  private final Counter bytes =
      Counter.builder()
          .name("kvferry_transfer_bytes_total")
          .help("Bytes of KV cache moved by this process's workers (sent or received)")
          .register(registry);

  private final Counter transfers =
      Counter.builder()
          .name("kvferry_transfers_total")
          .help("Transfers ended on this process's workers, by outcome")
          .labelNames("outcome")
          .register(registry);

  private final Counter failures =
      Counter.builder()
          .name("kvferry_transfer_failures_total")
          .help("Transfers that did not deliver their KV cache (outcome failed or expired)")
          .register(registry);

  private final Counter doneByWord =
      Counter.builder()
          .name("kvferry_receives_done_by_word_total")
          .help("Receives (D, WRITE) reported done from P's done words, before P's WriteDone")
          .register(registry);

  // 100 us to about 52 s: a layer of a short prompt up to a transfer near its timeout.
  private final Histogram transferLatency =
      Histogram.builder()
          .name("kvferry_transfer_latency_seconds")
          .help("From when a worker learned of a transfer to its end, by outcome")
          .labelNames("outcome")
          .classicOnly()
          .classicExponentialUpperBounds(0.0001, 2, 20)
          .register(registry);

  // 1 ms to about 65 s: end-to-end request latency as seen by a router or an engine.
  private final Histogram requestLatency =
      Histogram.builder()
          .name("kvferry_request_latency_seconds")
          .help("Request latency recorded by the engine or router through requestLatency()")
          .classicOnly()
          .classicExponentialUpperBounds(0.001, 2, 17)
          .register(registry);

  private final Gauge inFlight =
      Gauge.builder()
          .name("kvferry_transfers_in_flight")
          .help("Transfers in flight on this process's workers, by state, as of the last scrape")
          .labelNames("state")
          .register(registry);

  private final Set<String> inFlightStates = new HashSet<>();

  public NodeMetrics() {
    for (Outcome o : Outcome.values()) {
      transfers.initLabelValues(label(o));
    }
  }

  @Override
  public void transferEnded(Outcome outcome, long bytesMoved, long durationNanos) {
    String label = label(outcome);
    transfers.labelValues(label).inc();
    if (bytesMoved > 0) {
      bytes.inc(bytesMoved);
    }
    if (outcome == Outcome.FAILED || outcome == Outcome.EXPIRED) {
      failures.inc();
    }
    if (durationNanos >= 0) {
      transferLatency.labelValues(label).observe(durationNanos / 1e9);
    }
  }

  @Override
  public void receiveDoneByWord() {
    doneByWord.inc();
  }

  /** Records one request's latency, for engines and routers that time whole requests. */
  public void requestLatency(double seconds) {
    requestLatency.observe(seconds);
  }

  /**
   * Sets the in-flight gauge from a snapshot of the workers' transfers; a state seen before and
   * absent now goes back to 0 rather than vanishing.
   */
  public synchronized void transfersInFlight(Map<String, Integer> countsByState) {
    inFlightStates.addAll(countsByState.keySet());
    for (String state : inFlightStates) {
      inFlight.labelValues(state).set(countsByState.getOrDefault(state, 0));
    }
  }

  /** The registry behind these metrics, for components that add metrics of their own. */
  public PrometheusRegistry registry() {
    return registry;
  }

  /** The metrics in Prometheus text exposition format (version 0.0.4). */
  public String scrape() {
    ByteArrayOutputStream out = new ByteArrayOutputStream(4096);
    try {
      writer.write(out, registry.scrape());
    } catch (IOException e) {
      throw new UncheckedIOException("writing metrics to memory cannot fail", e);
    }
    return out.toString(StandardCharsets.UTF_8);
  }

  private static String label(Outcome outcome) {
    return outcome.name().toLowerCase(Locale.ROOT);
  }
}
