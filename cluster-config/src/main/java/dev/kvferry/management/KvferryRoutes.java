package dev.kvferry.management;

import static org.apache.pekko.http.javadsl.server.Directives.complete;
import static org.apache.pekko.http.javadsl.server.Directives.completeWithFuture;
import static org.apache.pekko.http.javadsl.server.Directives.concat;
import static org.apache.pekko.http.javadsl.server.Directives.get;
import static org.apache.pekko.http.javadsl.server.Directives.path;
import static org.apache.pekko.http.javadsl.server.Directives.pathPrefix;

import com.fasterxml.jackson.core.JsonProcessingException;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.typesafe.config.Config;
import dev.kvferry.node.NodeMetrics;
import dev.kvferry.node.NodeRuntime;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.Optional;
import java.util.concurrent.CompletionException;
import java.util.concurrent.CompletionStage;
import java.util.concurrent.TimeoutException;
import org.apache.pekko.actor.ExtendedActorSystem;
import org.apache.pekko.actor.typed.ActorSystem;
import org.apache.pekko.actor.typed.javadsl.Adapter;
import org.apache.pekko.http.javadsl.model.ContentType;
import org.apache.pekko.http.javadsl.model.ContentTypes;
import org.apache.pekko.http.javadsl.model.HttpEntities;
import org.apache.pekko.http.javadsl.model.HttpResponse;
import org.apache.pekko.http.javadsl.model.StatusCode;
import org.apache.pekko.http.javadsl.model.StatusCodes;
import org.apache.pekko.http.javadsl.server.Route;
import org.apache.pekko.management.javadsl.ManagementRouteProvider;
import org.apache.pekko.management.javadsl.ManagementRouteProviderSettings;

/**
 * kvferry's routes on the Pekko Management HTTP server, beside {@code /cluster/members},
 * {@code /ready} and {@code /alive}:
 *
 * <ul>
 *   <li>{@code GET /kvferry/engines}: every engine worker in the cluster (any node can answer);
 *   <li>{@code GET /kvferry/transfers}: this node's transfers in flight, by state;
 *   <li>{@code GET /kvferry/readiness}: what {@code /ready} decides on, field by field;
 *   <li>{@code GET /metrics}: this process's metrics, Prometheus text format 0.0.4.
 * </ul>
 *
 * Registered in config as {@code pekko.management.http.routes.kvferry}; Pekko Management creates it
 * by reflection with the actor system, so it finds the node through {@link NodeRuntime#of}.
 */
public final class KvferryRoutes implements ManagementRouteProvider {

  /** Config path of the timeout for asking the Receptionist and the workers. */
  private static final String ASK_TIMEOUT_PATH = "kvferry.management.ask-timeout";

  private static final Duration DEFAULT_ASK_TIMEOUT = Duration.ofSeconds(2);
  private static final ObjectMapper JSON = new ObjectMapper();
  private static final ContentType METRICS_CONTENT_TYPE =
      ContentTypes.parse(NodeMetrics.CONTENT_TYPE);

  private final ActorSystem<?> system;
  private final Duration askTimeout;

  public KvferryRoutes(ExtendedActorSystem classicSystem) {
    this.system = Adapter.toTyped(classicSystem);
    this.askTimeout = askTimeout(system);
  }

  @Override
  public Route routes(ManagementRouteProviderSettings settings) {
    return concat(
        pathPrefix(
            "kvferry",
            () ->
                concat(
                    path("engines", () -> get(this::engines)),
                    path("transfers", () -> get(this::transfers)),
                    path("readiness", () -> get(this::readiness)))),
        path("metrics", () -> get(this::metrics)));
  }

  private Route engines() {
    return completeWithFuture(
        EngineView.listAll(system, askTimeout)
            .thenApply(KvferryRoutes::json)
            .exceptionally(
                e -> {
                  Throwable cause = e instanceof CompletionException ? e.getCause() : e;
                  String why =
                      cause instanceof TimeoutException
                          ? "no answer from the Receptionist in " + askTimeout.toMillis() + " ms"
                          : String.valueOf(cause);
                  return error(StatusCodes.SERVICE_UNAVAILABLE, "cannot list engines: " + why);
                }));
  }

  private Route transfers() {
    Optional<NodeRuntime> runtime = NodeRuntime.of(system);
    if (runtime.isEmpty()) {
      return complete(notStarted());
    }
    return completeWithFuture(
        TransfersReport.collect(runtime.get(), askTimeout).thenApply(KvferryRoutes::json));
  }

  private Route readiness() {
    return complete(json(Readiness.of(system)));
  }

  private Route metrics() {
    Optional<NodeRuntime> runtime = NodeRuntime.of(system);
    if (runtime.isEmpty()) {
      return complete(notStarted());
    }
    NodeRuntime node = runtime.get();
    // The in-flight gauge is read from the workers at scrape time: the actors keep no counter.
    CompletionStage<HttpResponse> response =
        TransfersReport.collect(node, askTimeout)
            .thenApply(
                report -> {
                  node.metrics().transfersInFlight(report.counts());
                  byte[] text = node.metrics().scrape().getBytes(StandardCharsets.UTF_8);
                  return HttpResponse.create()
                      .withEntity(HttpEntities.create(METRICS_CONTENT_TYPE, text));
                });
    return completeWithFuture(response);
  }

  private HttpResponse notStarted() {
    return error(
        StatusCodes.SERVICE_UNAVAILABLE,
        "no kvferry node runtime in actor system " + system.name() + " (still starting?)");
  }

  private static Duration askTimeout(ActorSystem<?> system) {
    Config config = system.settings().config();
    return config.hasPath(ASK_TIMEOUT_PATH)
        ? config.getDuration(ASK_TIMEOUT_PATH)
        : DEFAULT_ASK_TIMEOUT;
  }

  private static HttpResponse json(Object body) {
    try {
      byte[] bytes = JSON.writeValueAsBytes(body);
      return HttpResponse.create()
          .withEntity(HttpEntities.create(ContentTypes.APPLICATION_JSON, bytes));
    } catch (JsonProcessingException e) {
      throw new IllegalStateException(
          "cannot write " + body.getClass().getSimpleName() + " as JSON", e);
    }
  }

  private static HttpResponse error(StatusCode status, String message) {
    return HttpResponse.create()
        .withStatus(status)
        .withEntity(ContentTypes.TEXT_PLAIN_UTF8, message);
  }
}
