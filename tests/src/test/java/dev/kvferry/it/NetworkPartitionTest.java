package dev.kvferry.it;

import dev.kvferry.engine.EngineService;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.fail;
import static org.junit.jupiter.api.Assumptions.assumeTrue;

import dev.kvferry.actors.connector.KvTransferParams;
import dev.kvferry.actors.connector.Role;
import dev.kvferry.demo.ChildProcess;
import dev.kvferry.demo.Demo;
import dev.kvferry.demo.DemoOptions;
import dev.kvferry.router.RouterActor;
import dev.kvferry.engine.RequestSpec;
import dev.kvferry.engine.EngineService.Outcome;
import java.nio.file.Files;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Optional;
import java.util.concurrent.CompletableFuture;
import org.apache.pekko.actor.testkit.typed.javadsl.TestProbe;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestInstance;

/**
 * A real network partition: the prefill and decode nodes run in network namespaces of their own,
 * joined to a bridge where the router and this test's client member listen; the data plane is
 * {@code tcp}, so KV bytes cross the veth links too. Mid-transfer the decode node's link goes down
 * (a pulled cable: silence, no resets). The split brain resolver (keep-majority) must decide: the
 * majority side (router, client, P) downs D, D downs itself and its JVM exits, P frees every block
 * it kept for D, nothing hangs. After the link comes back a new D joins and transfers succeed.
 *
 * <p>Needs root for {@code ip netns}; elsewhere the test is skipped with the reason printed,
 * except under CI (environment variable {@code CI} set), where it fails instead: "runs in CI" must
 * stay true.
 */
@TestInstance(TestInstance.Lifecycle.PER_CLASS)
class NetworkPartitionTest {

  private static final Duration DECIDED_WITHIN = Duration.ofSeconds(90);
  // 4, not 3: a write counts as caught mid-way only while two layers are still to compute. In a
  // CI run (2026-12-04) every write into D started only once P had computed two layers (D's block
  // ids came late on the loaded host), so with 3 layers none was ever mid-way and the test failed.
  private static final int LAYERS = 4;
  /**
   * docs/reliability.md. D exits 15.5-22 s after the cut (6 s heartbeat pause, 3 s stable-after).
   * P frees once D is removed and no copy to it is in flight (the block-lifetime rule): a tcp
   * copy caught on the cut link ended only at the 30 s I/O timeout in the runs here (43.2 s after
   * the cut), so the bound is removal plus that timeout, with room for a loaded two-core host.
   */
  private static final double FREED_AFTER_CUT_BOUND_S = 50;
  private static final double EXITED_AFTER_CUT_BOUND_S = 30;
  private static final Duration ROUTE_TIMEOUT = Duration.ofSeconds(120);

  private NetworkLab lab;
  private Demo demo;
  private ClusterChecks checks;

  @BeforeAll
  void startClusterInNamespaces() throws Exception {
    Optional<String> unavailable = NetworkLab.unavailableReason();
    if (unavailable.isPresent() && System.getenv("CI") != null) {
      fail("NetworkPartitionTest cannot run under CI: " + unavailable.get());
    }
    unavailable.ifPresent(reason -> System.out.println("NetworkPartitionTest skipped: " + reason));
    assumeTrue(unavailable.isEmpty(), () -> unavailable.orElse(""));
    lab = NetworkLab.create(List.of("prefill", "decode"));
    DemoOptions options = new DemoOptions("tcp", List.of("write", "read"), LAYERS, 2, 16, 4, 2, false,
        24, 256, 256, 1, 1, 120, 0, 0, 1, 7, false);
    demo = new Demo(options, ClusterChecks.FAST_DOWNING_SLOW_LAYERS, lab.bridgeHost());
    demo.startCluster(lab.placement("prefill"), lab.placement("decode"));
    checks = new ClusterChecks(demo, DECIDED_WITHIN, ROUTE_TIMEOUT);
    for (String mode : List.of("write", "read")) {
      demo.awaitSim(Role.PREFILL, demo.engineId("prefill", mode));
      demo.awaitSim(Role.DECODE, demo.engineId("decode", mode));
      demo.awaitRoutable(demo.engineId("prefill", mode), demo.engineId("decode", mode));
    }
    for (RouterActor.Routed r : checks.routeAll(8, "warm")) {
      assertEquals(Outcome.Status.DONE, r.status(), r.requestId() + ": " + r.detail());
    }
  }

  @AfterAll
  void tearDown() {
    try {
      if (demo != null) {
        System.out.println("NetworkPartitionTest logs: " + demo.logDir());
        demo.close();
      }
    } finally {
      if (lab != null) {
        lab.close(); // never leave namespaces or the bridge behind
      }
    }
  }

  @Test
  void cuttingDecodeOffLetsTheMajorityDownItFreesEveryBlockAndANewDecodeWorksAfterTheHeal()
      throws Exception {
    // Parked on P for D: WRITE requests prefilled and waiting for D's block ids, READ requests
    // whose blocks wait for D to read them. Only D's death or a 10-minute timer can free them.
    List<TestProbe<Outcome>> parked = new ArrayList<>();
    for (String mode : List.of("write", "read")) {
      for (int i = 0; i < 3; i++) {
        TestProbe<Outcome> probe = checks.kit().createTestProbe();
        String id = checks.nextId("parked");
        demo.awaitSim(Role.PREFILL, demo.engineId("prefill", mode))
            .tell(new EngineService.Submit(new RequestSpec(id, 40, 0, RequestSpec.Abort.NONE),
                KvTransferParams.forPrefill("tx-" + id, demo.engineId("decode", mode), 0),
                probe.ref()));
        parked.add(probe);
      }
    }
    for (TestProbe<Outcome> probe : parked) {
      Outcome o = probe.expectMessageClass(Outcome.class, ROUTE_TIMEOUT);
      assertEquals(Outcome.Status.DONE, o.status(), "prefill of " + o.requestId() + ": " + o.detail());
    }
    for (String mode : List.of("write", "read")) {
      checks.awaitHeld(Role.PREFILL, demo.engineId("prefill", mode), 3 * 10); // kept for D
    }
    List<CompletableFuture<RouterActor.Routed>> inFlight = checks.startRoutes(12, "busy");
    // Cut while bytes cross the link: a write into D caught with layers written, the last not
    // computed yet.
    ClusterChecks.WriteMidway midway =
        checks.awaitWriteMidway(demo.engineId("decode", "write"), LAYERS, "prefill");

    long cutAt = System.nanoTime();
    // Cut off, the minority downs itself and exits while we wait for P below: that exit is the
    // test's point, not a crash.
    demo.process("decode").expectExit();
    lab.isolate("decode");
    System.out.println("decode cut off with a write mid-way: " + midway);

    for (String mode : List.of("write", "read")) {
      checks.awaitAllFree(Role.PREFILL, demo.engineId("prefill", mode));
    }
    double freedAfter = (System.nanoTime() - cutAt) / 1e9;
    ChildProcess decode = demo.process("decode");
    assertTrue(decode.awaitExpectedExit(DECIDED_WITHIN),
        "the cut-off decode node should down itself (minority side) and exit; its log: "
            + decode.log());
    double exitedAfter = (decode.exitedAtNanos() - cutAt) / 1e9;
    String decodeLog = Files.readString(decode.log());
    assertTrue(decodeLog.contains("SBR took decision"),
        "the split brain resolver on D decided; D's log ends with:\n" + decode.tail(30));
    checks.awaitMembers(Role.DECODE, 0);
    for (CompletableFuture<RouterActor.Routed> f : inFlight) {
      RouterActor.Routed r = checks.await(f);
      assertTrue(r.status() == Outcome.Status.DONE
              || (r.status() == Outcome.Status.FAILED && r.detail().contains("decode")),
          "a request either finished before the cut or failed naming the decode side: " + r);
    }
    RouterActor.Routed cut = checks.answerTo(midway.requestId(), inFlight);
    assertEquals(Outcome.Status.FAILED, cut.status(), cut.toString());
    assertTrue(cut.detail().contains("decode"), cut.detail());
    checks.assertNoTransfersLeft("prefill");
    System.out.printf("partition: every P block free %.1f s after the cut, D exited after %.1f s%n",
        freedAfter, exitedAfter);
    assertTrue(freedAfter < FREED_AFTER_CUT_BOUND_S,
        "P freed D's blocks " + freedAfter + " s after the cut");
    assertTrue(exitedAfter < EXITED_AFTER_CUT_BOUND_S,
        "D downed itself and exited " + exitedAfter + " s after the cut");

    lab.heal("decode");
    demo.startNode("decode", Role.DECODE, 0, 1, lab.placement("decode"));
    for (String mode : List.of("write", "read")) {
      demo.awaitSim(Role.DECODE, demo.engineId("decode", mode));
      demo.awaitRoutable(demo.engineId("prefill", mode), demo.engineId("decode", mode));
    }
    for (RouterActor.Routed r : checks.routeAll(12, "healed")) {
      assertEquals(Outcome.Status.DONE, r.status(), r.requestId() + ": " + r.detail());
    }
    for (String mode : List.of("write", "read")) {
      checks.awaitAllFree(Role.PREFILL, demo.engineId("prefill", mode));
      checks.awaitAllFree(Role.DECODE, demo.engineId("decode", mode));
    }
    checks.assertNoTransfersLeft("prefill", "decode");
  }
}
