package dev.kvferry.it;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvferry.actors.connector.Role;
import dev.kvferry.actors.connector.TransferMode;
import dev.kvferry.demo.Demo;
import dev.kvferry.demo.DemoOptions;
import dev.kvferry.router.RouterActor;
import dev.kvferry.engine.RequestSpec;
import dev.kvferry.engine.EngineService.Outcome;
import java.time.Duration;
import java.util.List;
import java.util.Map;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestInstance;

/**
 * A block list too large for one cluster message, across JVMs: Artery would drop D's list of
 * block ids (with a log line on D only) and P would keep the request's blocks until its defer
 * timeout. Here the request fails at once on both sides with a reason naming the setting to
 * raise, every block is freed, and the next request succeeds. The frame is lowered to 64,000
 * bytes so a prompt of 30,000 one-token blocks is enough to exceed it.
 */
@TestInstance(TestInstance.Lifecycle.PER_CLASS)
class OversizedMessageTest {

  private static final Map<String, String> SMALL_FRAMES = Map.of(
      "pekko.remote.artery.advanced.maximum-frame-size", "64000",
      "kvferry.connector.defer-timeout", "10m",
      "kvferry.connector.transfer-timeout", "10m");
  private static final Duration ROUTE_TIMEOUT = Duration.ofSeconds(120);

  private Demo demo;
  private ClusterChecks checks;

  @BeforeAll
  void startCluster() throws Exception {
    // One layer of 8-byte tokens in one-token blocks: a long prompt is many ids, few bytes.
    DemoOptions options = new DemoOptions("cma", List.of("write"), 1, 1, 4, 1, 2, false,
        4, 40_000, 40_000, 1, 1, 100, 0, 0, 1, 11, false);
    demo = new Demo(options, SMALL_FRAMES);
    demo.startCluster();
    checks = new ClusterChecks(demo, Duration.ofSeconds(60), ROUTE_TIMEOUT);
    demo.awaitRoutable(demo.engineId("prefill", "write"), demo.engineId("decode", "write"));
  }

  @AfterAll
  void stopCluster() {
    if (demo != null) {
      System.out.println("OversizedMessageTest logs: " + demo.logDir());
      demo.close();
    }
  }

  @Test
  void aBlockListOverTheFrameSizeFailsAtOnceNamingTheSettingAndFreesBothSides() throws Exception {
    RouterActor.Routed big = route("too-many-blocks", 30_000);
    assertEquals(Outcome.Status.FAILED, big.status(), big.toString());
    System.out.println("oversized block list: " + big.detail());
    assertTrue(big.detail().contains("30000 block ids")
            && big.detail().contains("pekko.remote.artery.advanced.maximum-frame-size"),
        "the reason says what was too big and what to raise: " + big.detail());
    checks.awaitAllFree(Role.PREFILL, demo.engineId("prefill", "write"));
    checks.awaitAllFree(Role.DECODE, demo.engineId("decode", "write"));

    RouterActor.Routed next = route("after", 2_000);
    assertEquals(Outcome.Status.DONE, next.status(), next.toString());
    checks.awaitAllFree(Role.PREFILL, demo.engineId("prefill", "write"));
    checks.awaitAllFree(Role.DECODE, demo.engineId("decode", "write"));
  }

  private RouterActor.Routed route(String id, int promptTokens) throws Exception {
    return demo.route(new RequestSpec(id, promptTokens, 0, RequestSpec.Abort.NONE),
            TransferMode.WRITE, ROUTE_TIMEOUT)
        .toCompletableFuture().get(ROUTE_TIMEOUT.toSeconds(), TimeUnit.SECONDS);
  }
}
