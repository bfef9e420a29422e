package dev.kvferry.management;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import dev.kvferry.actors.TransferObserver.Outcome;
import dev.kvferry.node.NodeRuntime;
import java.net.http.HttpResponse;
import java.util.HashSet;
import java.util.Set;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.extension.ExtendWith;

/**
 * The management HTTP surface of a real one-node cluster, read with a real HTTP client (see
 * {@link ManagementNode} for what runs on it).
 */
@ExtendWith(ManagementNodeExtension.class)
class ManagementRoutesTest {

  private static final ObjectMapper JSON = new ObjectMapper();
  private static ManagementNode node;

  @BeforeAll
  static void start(ManagementNode shared) {
    node = shared;
  }

  private static JsonNode getJson(String path) throws Exception {
    HttpResponse<String> r = node.get(path);
    assertEquals(200, r.statusCode(), path + " answered: " + r.body());
    assertEquals("application/json", r.headers().firstValue("Content-Type").orElse(""));
    return JSON.readTree(r.body());
  }

  @Test
  void enginesListsEveryRegisteredWorkerWithItsIdentityAndNodeAddress() throws Exception {
    JsonNode engines = getJson("/kvferry/engines");
    assertEquals(2, engines.size(), engines.toString());

    JsonNode d = engines.get(0);
    assertEquals("decode", d.get("role").asText());
    assertEquals("decode-a", d.get("engineId").asText());
    assertEquals(0, d.get("dpRank").asInt());
    assertEquals(0, d.get("tpRank").asInt());
    assertEquals("write", d.get("mode").asText());
    assertEquals(node.clusterAddress(), d.get("address").asText());

    JsonNode p = engines.get(1);
    assertEquals("prefill", p.get("role").asText());
    assertEquals("prefill-b", p.get("engineId").asText());
    assertEquals(1, p.get("dpRank").asInt());
    assertEquals(0, p.get("tpRank").asInt());
    assertEquals("read", p.get("mode").asText());
    assertEquals(node.clusterAddress(), p.get("address").asText());
    assertTrue(p.get("address").asText().startsWith("pekko://kvferry@127.0.0.1:"));
    assertEquals(
        Set.of("role", "engineId", "dpRank", "tpRank", "mode", "address"), fieldNames(p));
  }

  @Test
  void transfersShowsTheWorkersReceiveInFlightByState() throws Exception {
    JsonNode report = getJson("/kvferry/transfers");
    assertEquals(1, report.get("counts").get("receiving").asInt(), report.toString());
    assertEquals(1, report.get("transfers").size());
    JsonNode t = report.get("transfers").get(0);
    assertEquals("req-1", t.get("requestId").asText());
    assertEquals("xfer-1", t.get("transferId").asText());
    assertEquals("receiving", t.get("state").asText());
    assertEquals("prefill-absent", t.get("peerEngineId").asText());
    assertEquals("decode-a/tp0", t.get("engine").asText());
    assertTrue(t.get("ageMs").asLong() >= 0);
    assertEquals(0, report.get("unanswered").size());
  }

  @Test
  void metricsServesPrometheusTextWithTransferCountersAndInFlightGauge() throws Exception {
    node.runtime.metrics().transferEnded(Outcome.RECEIVED, 4096, 2_000_000);
    HttpResponse<String> r = node.get("/metrics");
    assertEquals(200, r.statusCode());
    assertEquals(
        "text/plain; version=0.0.4; charset=utf-8",
        r.headers().firstValue("Content-Type").orElse("").toLowerCase(java.util.Locale.ROOT));
    String body = r.body();
    assertTrue(body.contains("kvferry_transfer_bytes_total 4096.0"), body);
    assertTrue(body.contains("kvferry_transfers_total{outcome=\"received\"} 1.0"), body);
    assertTrue(body.contains("kvferry_transfers_total{outcome=\"failed\"} 0.0"), body);
    assertTrue(body.contains("kvferry_transfer_failures_total 0.0"), body);
    assertTrue(
        body.contains("kvferry_transfer_latency_seconds_count{outcome=\"received\"} 1"), body);
    assertTrue(body.contains("kvferry_transfers_in_flight{state=\"receiving\"} 1.0"), body);
    assertTrue(body.contains("# TYPE kvferry_request_latency_seconds histogram"), body);
  }

  @Test
  void readyIsOkOnlyOnceTransportIsBoundAndHandshakeServed() throws Exception {
    try {
      node.runtime.transportBound = false;
      node.runtime.handshakeServed = true;
      HttpResponse<String> notBound = node.get("/ready");
      assertEquals(500, notBound.statusCode(), notBound.body());
      JsonNode why = getJson("/kvferry/readiness");
      assertFalse(why.get("ready").asBoolean());
      assertEquals("Up", why.get("memberStatus").asText());
      assertFalse(why.get("transportBound").asBoolean());
      assertTrue(why.get("handshakeServed").asBoolean());

      node.runtime.transportBound = true;
      node.runtime.handshakeServed = false;
      assertEquals(500, node.get("/ready").statusCode());

      node.runtime.handshakeServed = true;
      HttpResponse<String> ready = node.get("/ready");
      assertEquals(200, ready.statusCode(), ready.body());
      assertTrue(getJson("/kvferry/readiness").get("ready").asBoolean());
    } finally {
      node.runtime.transportBound = false;
      node.runtime.handshakeServed = false;
    }
  }

  @Test
  void nodeIsNotReadyAndSaysSoUntilItsRuntimeIsRegistered() throws Exception {
    NodeRuntime.unregister(node.runtime);
    try {
      assertEquals(500, node.get("/ready").statusCode());
      assertFalse(getJson("/kvferry/readiness").get("runtimeRegistered").asBoolean());
      HttpResponse<String> transfers = node.get("/kvferry/transfers");
      assertEquals(503, transfers.statusCode());
      assertEquals(
          "no kvferry node runtime in actor system kvferry (still starting?)", transfers.body());
    } finally {
      NodeRuntime.register(node.runtime);
    }
  }

  @Test
  void readinessExplainsWhatIsMissing() {
    assertEquals("ready", new Readiness(true, "Up", true, true, true).explain());
    assertEquals(
        "not ready: cluster member status is Joining, not Up; node runtime not started yet",
        new Readiness(false, "Joining", false, false, false).explain());
    assertEquals(
        "not ready: data-plane transport not bound; handshake metadata not served by every worker",
        new Readiness(false, "Up", true, false, false).explain());
  }

  @Test
  void aliveAndClusterMembersComeFromPekkoManagement() throws Exception {
    assertEquals(200, node.get("/alive").statusCode());
    JsonNode members = getJson("/cluster/members");
    assertEquals(1, members.get("members").size());
    assertEquals("Up", members.get("members").get(0).get("status").asText());
    assertEquals(node.clusterAddress(), members.get("members").get(0).get("node").asText());
  }

  private static Set<String> fieldNames(JsonNode n) {
    Set<String> names = new HashSet<>();
    n.fieldNames().forEachRemaining(names::add);
    return names;
  }
}
