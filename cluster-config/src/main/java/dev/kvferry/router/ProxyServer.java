package dev.kvferry.router;

import static dev.kvferry.node.PekkoFutures.plain;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import dev.kvferry.actors.connector.Role;
import dev.kvferry.actors.connector.TransferMode;
import dev.kvferry.engine.HttpEndpoint;
import io.prometheus.metrics.core.metrics.Counter;
import io.prometheus.metrics.core.metrics.Gauge;
import io.prometheus.metrics.core.metrics.Histogram;
import io.prometheus.metrics.model.registry.PrometheusRegistry;
import java.io.IOException;
import java.net.InetSocketAddress;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.UUID;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionStage;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;
import java.util.function.Consumer;
import org.apache.pekko.actor.typed.ActorSystem;
import org.apache.pekko.http.javadsl.Http;
import org.apache.pekko.http.javadsl.ServerBinding;
import org.apache.pekko.http.javadsl.model.ContentTypes;
import org.apache.pekko.http.javadsl.model.HttpEntities;
import org.apache.pekko.http.javadsl.model.HttpMethods;
import org.apache.pekko.http.javadsl.model.HttpRequest;
import org.apache.pekko.http.javadsl.model.HttpResponse;
import org.apache.pekko.http.javadsl.model.StatusCode;
import org.apache.pekko.http.javadsl.model.StatusCodes;
import org.apache.pekko.http.javadsl.model.headers.RawHeader;
import org.apache.pekko.stream.KillSwitches;
import org.apache.pekko.stream.Materializer;
import org.apache.pekko.stream.SharedKillSwitch;
import org.apache.pekko.stream.javadsl.Source;
import org.apache.pekko.util.ByteString;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The router as the disaggregation proxy (DESIGN section 11): OpenAI-compatible HTTP in front of
 * the engines the cluster lists ({@link EndpointDirectory}). Per request it picks a P and a D of
 * one transfer mode, fewest in flight first, each engine under a limit, and runs the two legs
 * with matching {@code kv_transfer_params}: WRITE sends both together, READ sends P's (one token)
 * first and D's with the params P returned. D's streamed answer streams back as it comes, and a
 * client that goes mid-stream cancels D's leg (D's abort tells P to end the transfer); a whole
 * JSON answer (no {@code "stream": true}) goes back whole, with its length.
 */
public final class ProxyServer implements AutoCloseable {

  private static final Logger log = LoggerFactory.getLogger(ProxyServer.class);
  private static final ObjectMapper JSON = new ObjectMapper();
  /**
   * A streamed answer the server has not started to send after this long: its client left
   * before the headers (the server drops such a response unread), so D's leg is ended here. (A
   * client pipelining requests on one connection, whose answer waits behind an earlier stream
   * for longer, loses it: OpenAI clients do not pipeline.)
   */
  private static final Duration UNCLAIMED_STREAM = Duration.ofSeconds(10);
  static final String REQUEST_ID = "X-Request-Id";

  /** The proxy's settings ({@code kvferry.router.http}). */
  public record Settings(String host, int port, int maxInFlightPerEngine, Duration legTimeout) {}

  private final ActorSystem<?> system;
  private final Http http;
  private final Materializer materializer;
  private final EndpointDirectory directory;
  private final Settings settings;
  private final ServerBinding binding;
  /** In flight per engine (engine id and DP rank), P and D legs alike. */
  private final Map<String, AtomicInteger> inFlight = new ConcurrentHashMap<>();
  private final AtomicLong ties = new AtomicLong();

  private final Counter requests;
  private final Histogram ttft;
  private final Gauge inFlightGauge;

  private ProxyServer(ActorSystem<?> system, Settings settings, PrometheusRegistry registry)
      throws Exception {
    this.system = system;
    this.settings = settings;
    this.http = Http.get(system);
    this.materializer = Materializer.matFromSystem(system);
    this.directory = new EndpointDirectory(system);
    this.requests = Counter.builder().name("kvferry_router_requests_total")
        .help("Requests the router's HTTP proxy answered, by outcome")
        .labelNames("outcome").register(registry);
    for (String o : List.of("ok", "client_gone", "engine_error", "no_engine", "bad_request")) {
      requests.initLabelValues(o);
    }
    // 1 ms to about 65 s.
    this.ttft = Histogram.builder().name("kvferry_router_ttft_seconds")
        .help("From a request's arrival to the first bytes of D's answer")
        .classicOnly().classicExponentialUpperBounds(0.001, 2, 17).register(registry);
    this.inFlightGauge = Gauge.builder().name("kvferry_router_in_flight")
        .help("Legs in flight on each engine, as the router counts them")
        .labelNames("engine", "role").register(registry);
    this.binding = http.newServerAt(settings.host(), settings.port())
        .bind(this::handle).toCompletableFuture().get(30, TimeUnit.SECONDS);
  }

  /** Serves the proxy on {@code settings}' address until closed. */
  public static ProxyServer start(ActorSystem<?> system, Settings settings,
      PrometheusRegistry registry) throws Exception {
    return new ProxyServer(system, settings, registry);
  }

  public InetSocketAddress address() {
    return binding.localAddress();
  }

  private CompletionStage<HttpResponse> handle(HttpRequest request) {
    String path = request.getUri().path();
    String id = request.getHeader(REQUEST_ID).map(h -> h.value())
        .orElseGet(() -> "kvf-" + UUID.randomUUID());
    CompletionStage<HttpResponse> response;
    if (request.method() == HttpMethods.GET && path.equals("/v1/models")) {
      request.discardEntityBytes(materializer);
      response = models();
    } else if (request.method() == HttpMethods.POST
        && (path.equals("/v1/completions") || path.equals("/v1/chat/completions"))) {
      long arrived = System.nanoTime();
      response = plain(request.entity().toStrict(30_000, materializer))
          .thenCompose(e -> proxy(path, e.getData(), id, arrived));
    } else {
      request.discardEntityBytes(materializer);
      response = CompletableFuture.completedFuture(error(StatusCodes.NOT_FOUND,
          "invalid_request_error", "no route " + request.method().value() + " " + path
              + "; served: POST /v1/completions, POST /v1/chat/completions, GET /v1/models"));
    }
    return response.thenApply(r -> r.addHeader(RawHeader.create(REQUEST_ID, id)));
  }

  private CompletionStage<HttpResponse> models() {
    List<HttpEndpoint> ds = directory.snapshot().stream()
        .filter(e -> e.role() == Role.DECODE).toList();
    if (ds.isEmpty()) {
      return CompletableFuture.completedFuture(json(StatusCodes.OK,
          JSON.createObjectNode().put("object", "list").set("data", JSON.createArrayNode())));
    }
    HttpEndpoint d = ds.get(0);
    return plain(http.singleRequest(HttpRequest.GET(d.url() + "/v1/models")))
        .thenCompose(r -> plain(r.entity().toStrict(10_000, materializer))
            .thenApply(e -> HttpResponse.create().withStatus(r.status())
                .withEntity(HttpEntities.create(ContentTypes.APPLICATION_JSON, e.getData()))))
        .exceptionally(e -> error(StatusCodes.BAD_GATEWAY, "server_error",
            String.valueOf(new LegFailed(d, "unreachable: " + unwrap(e).getMessage()).getMessage())));
  }

  /** One P and one D of a mode, both under their limit, or empty. */
  private Optional<HttpEndpoint[]> pick() {
    List<HttpEndpoint> all = directory.snapshot();
    for (TransferMode mode : List.of(TransferMode.WRITE, TransferMode.READ)) {
      Optional<HttpEndpoint> p = leastBusy(all, Role.PREFILL, mode);
      Optional<HttpEndpoint> d = leastBusy(all, Role.DECODE, mode);
      if (p.isPresent() && d.isPresent()) {
        return Optional.of(new HttpEndpoint[] {p.get(), d.get()});
      }
    }
    return Optional.empty();
  }

  private Optional<HttpEndpoint> leastBusy(List<HttpEndpoint> all, Role role, TransferMode mode) {
    List<HttpEndpoint> best = new ArrayList<>();
    int fewest = Integer.MAX_VALUE;
    for (HttpEndpoint e : all) {
      if (e.role() != role || e.mode() != mode) {
        continue;
      }
      int n = counter(e).get();
      if (n >= settings.maxInFlightPerEngine()) {
        continue;
      }
      if (n < fewest) {
        fewest = n;
        best.clear();
      }
      if (n == fewest) {
        best.add(e);
      }
    }
    if (best.isEmpty()) {
      return Optional.empty();
    }
    // Ties (every DP rank idle, say) go round-robin.
    return Optional.of(best.get(Math.floorMod(ties.getAndIncrement(), best.size())));
  }

  private static String key(HttpEndpoint e) {
    return e.engineId() + "/dp" + e.dpRank();
  }

  private AtomicInteger counter(HttpEndpoint e) {
    return inFlight.computeIfAbsent(key(e), k -> new AtomicInteger());
  }

  private void begin(HttpEndpoint e) {
    inFlightGauge.labelValues(key(e), e.role().clusterRole()).set(counter(e).incrementAndGet());
  }

  private void end(HttpEndpoint e) {
    inFlightGauge.labelValues(key(e), e.role().clusterRole()).set(counter(e).decrementAndGet());
  }

  /** D's leg of a request is over: one fewer in flight on D, and the request counted by outcome. */
  private void ended(HttpEndpoint d, String outcome) {
    end(d);
    requests.labelValues(outcome).inc();
  }

  private CompletionStage<HttpResponse> proxy(String path, ByteString body, String id,
      long arrived) {
    ObjectNode request;
    try {
      JsonNode parsed = JSON.readTree(body.toArray());
      if (!(parsed instanceof ObjectNode o)) {
        throw new IOException("the body must be a JSON object");
      }
      request = o;
    } catch (IOException e) {
      requests.labelValues("bad_request").inc();
      return CompletableFuture.completedFuture(error(StatusCodes.BAD_REQUEST,
          "invalid_request_error", "bad JSON body: " + e.getMessage()));
    }
    Optional<HttpEndpoint[]> pair = pick();
    if (pair.isEmpty()) {
      requests.labelValues("no_engine").inc();
      return CompletableFuture.completedFuture(error(StatusCodes.SERVICE_UNAVAILABLE,
          "server_error", "no prefill and decode engine of one transfer mode is listed with room"
              + " (limit " + settings.maxInFlightPerEngine() + " in flight per engine)"));
    }
    HttpEndpoint p = pair.get()[0];
    HttpEndpoint d = pair.get()[1];
    boolean streamed = request.path("stream").asBoolean(false);
    begin(p);
    begin(d);
    String transferId = id + "-" + UUID.randomUUID();
    ObjectNode pBody = request.deepCopy();
    pBody.put("max_tokens", 1);
    if (pBody.has("max_completion_tokens")) {
      pBody.put("max_completion_tokens", 1); // vLLM's chat API takes it over max_tokens
    }
    pBody.remove("min_tokens"); // above 1, P would refuse a one-token answer
    pBody.put("stream", false);
    pBody.remove("stream_options");
    pBody.set("kv_transfer_params", JSON.createObjectNode().put("do_remote_decode", true)
        .put("do_remote_prefill", false).put("transfer_id", transferId)
        .put("remote_engine_id", d.engineId()).put("remote_dp_rank", d.dpRank()));
    CompletionStage<HttpResponse> pLeg = leg(p, path, pBody, id)
        .whenComplete((r, e) -> end(p));
    CompletionStage<ObjectNode> dBody;
    if (p.mode() == TransferMode.WRITE) {
      ObjectNode b = request.deepCopy();
      b.set("kv_transfer_params", JSON.createObjectNode().put("do_remote_prefill", true)
          .put("do_remote_decode", false).put("transfer_id", transferId)
          .put("remote_engine_id", p.engineId()).put("remote_dp_rank", p.dpRank()));
      dBody = CompletableFuture.completedFuture(b);
    } else {
      // READ: D needs P's block ids, which P's answer carries.
      dBody = pLeg.thenCompose(r -> strictJson(r, p)).thenApply(pAnswer -> {
        JsonNode params = pAnswer.get("kv_transfer_params");
        if (!(params instanceof ObjectNode o)) {
          throw new LegFailed(p, "its answer carries no kv_transfer_params");
        }
        ObjectNode b = request.deepCopy();
        b.set("kv_transfer_params", o);
        return b;
      });
    }
    SharedKillSwitch cut = KillSwitches.shared("request-" + id);
    // D's leg ends once, whichever way: its answer, the client's stream ending, or neither.
    AtomicBoolean dEnded = new AtomicBoolean();
    Consumer<String> endD = outcome -> {
      if (dEnded.compareAndSet(false, true)) {
        ended(d, outcome);
      }
    };
    CompletableFuture<Throwable> pFailed = new CompletableFuture<>();
    if (p.mode() == TransferMode.WRITE) {
      // P's leg runs beside D's: if it fails, D would wait for KV that never comes.
      pLeg.thenCompose(r -> strictJson(r, p)).whenComplete((ok, e) -> {
        if (e != null) {
          pFailed.complete(unwrap(e));
          cut.abort(e);
        }
      });
    }
    CompletionStage<HttpResponse> answer = dBody.thenCompose(b -> leg(d, path, b, id))
        .thenCompose(r -> {
          if (!r.status().isSuccess()) {
            return plain(r.entity().toStrict(10_000, materializer)).thenApply(e -> {
              throw new LegFailed(d, r.status().intValue(), "HTTP " + r.status().intValue() + ": "
                  + e.getData().utf8String());
            });
          }
          Throwable pCause = pFailed.getNow(null);
          if (pCause != null) {
            // P failed before D answered: its cause is the client's answer, not a cut stream.
            r.discardEntityBytes(materializer);
            return CompletableFuture.failedFuture(pCause);
          }
          if (!streamed) {
            // One JSON answer, whole at D's end: passed on whole, without a stream of chunks.
            return plain(r.entity().toStrict(settings.legTimeout().toMillis(), materializer))
                .thenApply(e -> {
                  ttft.observe((System.nanoTime() - arrived) / 1e9);
                  endD.accept("ok");
                  return HttpResponse.create().withStatus(r.status()).withEntity(e);
                });
          }
          AtomicBoolean first = new AtomicBoolean(true);
          AtomicBoolean claimed = new AtomicBoolean();
          Source<ByteString, ?> bytes = r.entity().getDataBytes()
              .via(cut.flow())
              .map(chunk -> {
                if (first.compareAndSet(true, false)) {
                  ttft.observe((System.nanoTime() - arrived) / 1e9);
                }
                return chunk;
              })
              .watchTermination((mat, done) -> {
                claimed.set(true);
                plain(done).whenComplete((ok, e) -> endD.accept(e == null ? "ok" : "client_gone"));
                return mat;
              });
          // A client gone before the headers: the server drops the response unread, so the
          // stream above never runs. Without this D stayed counted in flight for good.
          system.scheduler().scheduleOnce(UNCLAIMED_STREAM, () -> {
            if (claimed.compareAndSet(false, true)) {
              r.discardEntityBytes(materializer);
              endD.accept("client_gone");
            }
          }, system.executionContext());
          return CompletableFuture.completedFuture(HttpResponse.create().withStatus(r.status())
              .withEntity(HttpEntities.createChunked(r.entity().getContentType(), bytes)));
        });
    CompletionStage<HttpResponse> result = answer.exceptionally(e -> {
      endD.accept("engine_error");
      return failure(id, unwrap(e));
    });
    if (p.mode() == TransferMode.WRITE && !streamed) {
      // Nothing of D's answer has reached the client yet: P's failure answers it at once, not
      // after D gave up waiting for the KV (D's leg is still counted until it ends).
      CompletableFuture<HttpResponse> first = new CompletableFuture<>();
      result.whenComplete((r, e) -> {
        if (e == null) {
          first.complete(r);
        } else {
          first.completeExceptionally(e);
        }
      });
      pFailed.thenAccept(cause -> {
        if (!first.isDone()) {
          first.complete(failure(id, cause));
        }
      });
      return first;
    }
    return result;
  }

  private static Throwable unwrap(Throwable e) {
    return e instanceof java.util.concurrent.CompletionException && e.getCause() != null
        ? e.getCause() : e;
  }

  /**
   * The client's answer to a failed request: an engine's own 4xx passes through (the request
   * cannot succeed as it is; a retry on 5xx would repeat it), everything else is 502.
   */
  private static HttpResponse failure(String id, Throwable cause) {
    String why = cause instanceof LegFailed f ? String.valueOf(f.getMessage()) : String.valueOf(cause);
    log.warn("request {}: {}", id, why);
    if (cause instanceof LegFailed f && f.status >= 400 && f.status < 500) {
      return error(StatusCodes.get(f.status), "invalid_request_error", why);
    }
    return error(StatusCodes.BAD_GATEWAY, "server_error", why);
  }

  /** A failed leg: the engine and why, for the client's error. */
  private static final class LegFailed extends RuntimeException {
    private static final long serialVersionUID = 1L;
    /** The engine's HTTP status; 0 where it gave none (unreachable, an answer not understood). */
    final int status;

    LegFailed(HttpEndpoint e, String why) {
      this(e, 0, why);
    }

    LegFailed(HttpEndpoint e, int status, String why) {
      super((e.role() == Role.PREFILL ? "prefill" : "decode") + " engine " + e.engineId()
          + " (dp " + e.dpRank() + "): " + why);
      this.status = status;
    }
  }

  private CompletionStage<HttpResponse> leg(HttpEndpoint e, String path, ObjectNode body,
      String id) {
    byte[] bytes;
    try {
      bytes = JSON.writeValueAsBytes(body);
    } catch (IOException ex) {
      return CompletableFuture.failedFuture(ex);
    }
    HttpRequest r = HttpRequest.POST(e.url() + path)
        .withEntity(HttpEntities.create(ContentTypes.APPLICATION_JSON, bytes))
        .addHeader(RawHeader.create(REQUEST_ID, id));
    return plain(http.singleRequest(r)).exceptionally(ex -> {
      throw new LegFailed(e, "unreachable: " + ex.getMessage());
    });
  }

  private CompletionStage<ObjectNode> strictJson(HttpResponse r, HttpEndpoint e) {
    return plain(r.entity().toStrict(settings.legTimeout().toMillis(), materializer)).thenApply(s -> {
      if (!r.status().isSuccess()) {
        throw new LegFailed(e, r.status().intValue(),
            "HTTP " + r.status().intValue() + ": " + s.getData().utf8String());
      }
      try {
        JsonNode n = JSON.readTree(s.getData().toArray());
        if (n instanceof ObjectNode o) {
          return o;
        }
        throw new LegFailed(e, "its answer is not a JSON object");
      } catch (IOException ex) {
        throw new LegFailed(e, "its answer is not JSON: " + ex.getMessage());
      }
    });
  }

  static HttpResponse error(StatusCode status, String type, String message) {
    ObjectNode err = JSON.createObjectNode();
    err.putObject("error").put("message", message).put("type", type).put("code", status.intValue());
    return json(status, err);
  }

  private static HttpResponse json(StatusCode status, JsonNode body) {
    try {
      return HttpResponse.create().withStatus(status).withEntity(
          HttpEntities.create(ContentTypes.APPLICATION_JSON, JSON.writeValueAsBytes(body)));
    } catch (IOException e) {
      throw new IllegalStateException(e);
    }
  }

  @Override
  public void close() {
    binding.unbind();
  }
}
