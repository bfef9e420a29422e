package dev.kvferry.it;

import dev.kvferry.engine.EngineService;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import dev.kvferry.actors.connector.Role;
import dev.kvferry.actors.connector.TransferMode;
import dev.kvferry.demo.Demo;
import dev.kvferry.router.RouterActor;
import dev.kvferry.engine.RequestSpec;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import java.util.stream.StreamSupport;
import org.apache.pekko.actor.testkit.typed.javadsl.ActorTestKit;
import org.apache.pekko.cluster.MemberStatus;
import org.apache.pekko.cluster.typed.Cluster;

/**
 * What the multi-JVM fault tests do with a running demo cluster: route traffic through its router,
 * and wait (up to a deadline, never as a timing assertion) for the state every fault must end in:
 * allocators full, no open transfers, the dead members gone.
 */
final class ClusterChecks {
  /**
   * Cluster settings for fault tests: a silent member is unreachable after ~6 s (kvferry's
   * default; shorter pauses made this loaded two-core host flag healthy nodes) and downed 3 s
   * later, while every connector timer is ten minutes, so whatever frees a block within a test's
   * deadline is the cluster reacting to the fault, not a timer.
   */
  static final Map<String, String> FAST_DOWNING = Map.of(
      "pekko.cluster.failure-detector.acceptable-heartbeat-pause", "6s",
      "pekko.cluster.split-brain-resolver.stable-after", "3s",
      "kvferry.connector.defer-timeout", "10m",
      "kvferry.connector.transfer-timeout", "10m",
      "kvferry.connector.read-abort-timeout", "10m");

  /**
   * {@link #FAST_DOWNING}, and the simulated engines take this long to compute each layer after
   * the first, so a transfer is mid-way (layers written, the last not computed yet) for seconds:
   * long enough to catch it there and cut it off. With 300 ms a CI run on two cores (at 9309620)
   * caught a write with 4 of 6 layers computed, killed D, and the write had still finished: the
   * prefill node's /kvferry/transfers answer was that stale. A caught write now has at least
   * 800 ms of compute left.
   */
  static final Duration LAYER_COMPUTE = Duration.ofMillis(800);

  static final Map<String, String> FAST_DOWNING_SLOW_LAYERS = with(FAST_DOWNING,
      "kvferry.node.simulated-layer-compute", LAYER_COMPUTE.toMillis() + "ms");

  private static Map<String, String> with(Map<String, String> base, String key, String value) {
    Map<String, String> m = new java.util.HashMap<>(base);
    m.put(key, value);
    return Map.copyOf(m);
  }

  /**
   * A write P was caught in with its bytes moving: as {@code node}'s /kvferry/transfers showed it,
   * some layers written to {@code peerEngineId} and the last layer not even computed yet.
   */
  record WriteMidway(String node, String requestId, String transferId, String peerEngineId,
      int layersFired, int layerWritesDone, int layers) {
    @Override
    public String toString() {
      return requestId + " on " + node + " to " + peerEngineId + ": " + layerWritesDone
          + " layer writes done, " + layersFired + " of " + layers + " layers computed";
    }
  }

  /**
   * Polls the prefill {@code nodes}' /kvferry/transfers until one shows a write to {@code
   * peerEngineId} that is mid-way: at least one layer written and at least two layers not yet
   * computed, so it cannot finish within one layer's compute time of being seen (one layer left
   * was too little on a loaded host: the poll and the kill came after the last layer had landed).
   */
  WriteMidway awaitWriteMidway(String peerEngineId, int layers, String... nodes) {
    WriteMidway[] seen = new WriteMidway[1];
    // What the polls saw instead, for the failure message: (state, peer, fired/done) -> times.
    Map<String, Integer> sawInstead = new java.util.TreeMap<>();
    int[] polls = new int[1];
    kit.createTestProbe().awaitAssert(within, Duration.ofMillis(5), () -> {
      polls[0]++;
      for (String node : nodes) {
        for (JsonNode t : transfers(node).path("transfers")) {
          JsonNode p = t.path("progress");
          sawInstead.merge(node + " " + t.path("state").asText() + " to "
              + t.path("peerEngineId").asText() + " fired " + p.path("layersFired").asInt()
              + " written " + p.path("layerWritesDone").asInt(), 1, Integer::sum);
          if (t.path("state").asText().equals("writing")
              && t.path("peerEngineId").asText().equals(peerEngineId)
              && p.path("layerWritesDone").asInt() >= 1
              && p.path("layersFired").asInt() <= layers - 2) {
            seen[0] = new WriteMidway(node, t.path("requestId").asText(),
                t.path("transferId").asText(), peerEngineId, p.path("layersFired").asInt(),
                p.path("layerWritesDone").asInt(), layers);
            return null;
          }
        }
      }
      throw new AssertionError("no write to " + peerEngineId + " caught mid-way on "
          + String.join(", ", nodes) + " in " + polls[0] + " polls; they showed " + sawInstead);
    });
    return seen[0];
  }

  /** The answer to the routed request {@code requestId} among {@code routed}. */
  RouterActor.Routed answerTo(String requestId,
      List<CompletableFuture<RouterActor.Routed>> routed) throws Exception {
    for (CompletableFuture<RouterActor.Routed> f : routed) {
      RouterActor.Routed r = await(f);
      if (r.requestId().equals(requestId)) {
        return r;
      }
    }
    throw new AssertionError(requestId + " is not among the routed requests");
  }

  private final Demo demo;
  private final ActorTestKit kit;
  private final Duration within;
  private final Duration routeTimeout;
  private final HttpClient http = HttpClient.newHttpClient();
  private final ObjectMapper json = new ObjectMapper();
  private int nextRequest;

  /**
   * @param within how long each wait may take
   * @param routeTimeout how long a routed request may take
   */
  ClusterChecks(Demo demo, Duration within, Duration routeTimeout) {
    this.demo = demo;
    this.kit = ActorTestKit.create(demo.client());
    this.within = within;
    this.routeTimeout = routeTimeout;
  }

  ActorTestKit kit() {
    return kit;
  }

  /** A request id unique within this test run. */
  String nextId(String prefix) {
    return prefix + "-" + (nextRequest++);
  }

  /** {@code n} requests, alternating modes, prompts of 1 to 120 tokens, all sent at once. */
  List<CompletableFuture<RouterActor.Routed>> startRoutes(int n, String prefix) {
    List<CompletableFuture<RouterActor.Routed>> out = new ArrayList<>();
    for (int i = 0; i < n; i++) {
      TransferMode mode = i % 2 == 0 ? TransferMode.WRITE : TransferMode.READ;
      RequestSpec spec =
          new RequestSpec(nextId(prefix), 1 + (i * 37) % 120, 0, RequestSpec.Abort.NONE);
      out.add(demo.route(spec, mode, routeTimeout).toCompletableFuture());
    }
    return out;
  }

  List<RouterActor.Routed> routeAll(int n, String prefix) throws Exception {
    List<RouterActor.Routed> out = new ArrayList<>();
    for (CompletableFuture<RouterActor.Routed> f : startRoutes(n, prefix)) {
      out.add(await(f));
    }
    return out;
  }

  RouterActor.Routed await(CompletableFuture<RouterActor.Routed> routed) throws Exception {
    return routed.get(routeTimeout.toSeconds(), TimeUnit.SECONDS);
  }

  EngineService.Stats stats(Role role, String engineId) throws Exception {
    return demo.stats(demo.awaitSim(role, engineId));
  }

  /** Waits until {@code engineId} holds {@code held} blocks (0: all free, nothing in flight). */
  void awaitHeld(Role role, String engineId, int held) {
    kit.createTestProbe().awaitAssert(within, Duration.ofMillis(200), () -> {
      EngineService.Stats s = stats(role, engineId);
      assertEquals(s.numBlocks() - held, s.freeBlocks(), engineId + ": blocks held");
      if (held == 0) {
        assertEquals(0, s.requestsInFlight(), engineId + ": no request in flight");
      }
      return null;
    });
  }

  void awaitAllFree(Role role, String engineId) {
    awaitHeld(role, engineId, 0);
  }

  /** Waits until {@code n} members of {@code role} are up and none is unreachable. */
  void awaitMembers(Role role, int n) {
    Cluster cluster = Cluster.get(demo.client());
    kit.createTestProbe().awaitAssert(within, Duration.ofMillis(200), () -> {
      long up = StreamSupport.stream(cluster.state().getMembers().spliterator(), false)
          .filter(m -> m.hasRole(role.clusterRole()) && m.status() == MemberStatus.up())
          .count();
      assertEquals(n, up, role + " members up");
      assertTrue(cluster.state().getUnreachable().isEmpty(), "unreachable members left");
      return null;
    });
  }

  /** GET {@code path} on the management HTTP of process {@code node}, as JSON. */
  JsonNode management(String node, String path) throws Exception {
    HttpResponse<String> r = http.send(
        HttpRequest.newBuilder(demo.managementUri(node).resolve(path)).build(),
        HttpResponse.BodyHandlers.ofString());
    assertEquals(200, r.statusCode(), node + " " + path + ": " + r.body());
    return json.readTree(r.body());
  }

  JsonNode transfers(String node) throws Exception {
    return management(node, "kvferry/transfers");
  }

  /** Waits until no transfer is open or unanswered on any of {@code nodes}. */
  void assertNoTransfersLeft(String... nodes) {
    for (String node : nodes) {
      kit.createTestProbe().awaitAssert(within, Duration.ofMillis(200), () -> {
        JsonNode t = transfers(node);
        assertEquals(0, t.path("transfers").size(), node + " /kvferry/transfers: " + t);
        assertEquals(0, t.path("unanswered").size(), node + " /kvferry/transfers: " + t);
        return null;
      });
    }
  }
}
