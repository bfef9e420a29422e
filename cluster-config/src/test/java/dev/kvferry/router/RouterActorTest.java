package dev.kvferry.router;

import dev.kvferry.engine.EngineService;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvferry.actors.connector.Role;
import dev.kvferry.actors.connector.TransferMode;
import dev.kvferry.actors.engine.EngineIdentity;
import dev.kvferry.engine.RequestSpec;
import dev.kvferry.engine.EngineService.Outcome;
import java.time.Duration;
import org.apache.pekko.actor.testkit.typed.javadsl.ActorTestKit;
import org.apache.pekko.actor.testkit.typed.javadsl.TestProbe;
import org.apache.pekko.actor.typed.ActorRef;
import org.apache.pekko.actor.typed.Behavior;
import org.apache.pekko.actor.typed.javadsl.Behaviors;
import org.apache.pekko.actor.typed.receptionist.Receptionist;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;

/** Routing decisions from live listings: load balance, mode, engines that leave. */
class RouterActorTest {

  private final ActorTestKit kit = ActorTestKit.create();

  @AfterEach
  void stop() {
    kit.shutdownTestKit();
  }

  /** A simulated engine stand-in: registers like the real one and forwards submissions. */
  private ActorRef<EngineService.Command> engine(
      Role role, String id, TransferMode mode, TestProbe<EngineService.Submit> inbox) {
    Behavior<EngineService.Command> b = Behaviors.setup(ctx -> {
      ctx.getSystem().receptionist().tell(Receptionist.register(EngineService.serviceKey(role), ctx.getSelf()));
      return Behaviors.receive(EngineService.Command.class)
          .onMessage(EngineService.Submit.class, m -> {
            inbox.ref().tell(m);
            return Behaviors.same();
          })
          .build();
    });
    String name = "sim~" + new EngineIdentity(role, id, 0, 1, 0, 1, mode).toActorName();
    return kit.spawn(b, name);
  }

  private void awaitListed(Role role, int count) {
    TestProbe<Receptionist.Listing> probe = kit.createTestProbe();
    probe.awaitAssert(Duration.ofSeconds(5), () -> {
      kit.system().receptionist().tell(Receptionist.find(EngineService.serviceKey(role), probe.ref()));
      assertEquals(count, probe.receiveMessage().getServiceInstances(EngineService.serviceKey(role)).size());
      return null;
    });
  }

  /** Waits until the router itself routes to {@code prefill} and {@code decode} engines. */
  private static void awaitRoutable(ActorTestKit kit, ActorRef<RouterActor.Command> router,
      int prefill, int decode) {
    TestProbe<RouterActor.Routable> probe = kit.createTestProbe();
    probe.awaitAssert(Duration.ofSeconds(5), () -> {
      router.tell(new RouterActor.GetRoutable(probe.ref()));
      RouterActor.Routable r = probe.receiveMessage();
      assertEquals(prefill, r.prefill().size(), "prefill engines routable: " + r);
      assertEquals(decode, r.decode().size(), "decode engines routable: " + r);
      return null;
    });
  }

  private static RequestSpec spec(String id) {
    return new RequestSpec(id, 64, 0, RequestSpec.Abort.NONE);
  }

  private static void reply(EngineService.Submit s, Role role, Outcome.Status status) {
    s.replyTo().tell(new Outcome(s.spec().requestId(), "x", role, status, null, 10, 5, "ok"));
  }

  @Test
  void writeModeSubmitsToBothSidesAndAnswersWithDecodesOutcome() {
    TestProbe<EngineService.Submit> p = kit.createTestProbe();
    TestProbe<EngineService.Submit> d = kit.createTestProbe();
    engine(Role.PREFILL, "p0", TransferMode.WRITE, p);
    engine(Role.DECODE, "d0", TransferMode.WRITE, d);
    awaitListed(Role.PREFILL, 1);
    awaitListed(Role.DECODE, 1);
    ActorRef<RouterActor.Command> router = kit.spawn(RouterActor.create());
    TestProbe<RouterActor.Routed> client = kit.createTestProbe();
    awaitRoutable(kit, router, 1, 1);
    router.tell(new RouterActor.Route(spec("r1"), TransferMode.WRITE, client.ref()));
    EngineService.Submit toP = p.fishForMessage(Duration.ofSeconds(3),
        m -> m.spec().requestId().equals("r1")
            ? org.apache.pekko.actor.testkit.typed.javadsl.FishingOutcomes.complete()
            : org.apache.pekko.actor.testkit.typed.javadsl.FishingOutcomes.continueAndIgnore()).get(0);
    EngineService.Submit toD = d.fishForMessage(Duration.ofSeconds(3),
        m -> m.spec().requestId().equals("r1")
            ? org.apache.pekko.actor.testkit.typed.javadsl.FishingOutcomes.complete()
            : org.apache.pekko.actor.testkit.typed.javadsl.FishingOutcomes.continueAndIgnore()).get(0);
    assertTrue(toP.params().doRemoteDecode());
    assertTrue(toD.params().doRemotePrefill());
    assertEquals(toP.params().transferId(), toD.params().transferId());
    assertEquals("d0", toP.params().remoteEngineId());
    assertEquals("p0", toD.params().remoteEngineId());
    reply(toP, Role.PREFILL, Outcome.Status.DONE);
    reply(toD, Role.DECODE, Outcome.Status.DONE);
    RouterActor.Routed routed = client.fishForMessage(Duration.ofSeconds(3),
        m -> m.requestId().equals("r1")
            ? org.apache.pekko.actor.testkit.typed.javadsl.FishingOutcomes.complete()
            : org.apache.pekko.actor.testkit.typed.javadsl.FishingOutcomes.continueAndIgnore()).get(0);
    assertEquals(Outcome.Status.DONE, routed.status());
    assertEquals("p0", routed.prefillEngineId());
  }

  /** Routes one WRITE request and answers it with the two sides' outcomes; the client's answer. */
  private RouterActor.Routed routeAnsweredWith(Outcome.Status prefill, Outcome.Status decode) {
    TestProbe<EngineService.Submit> p = kit.createTestProbe();
    TestProbe<EngineService.Submit> d = kit.createTestProbe();
    engine(Role.PREFILL, "p0", TransferMode.WRITE, p);
    engine(Role.DECODE, "d0", TransferMode.WRITE, d);
    awaitListed(Role.PREFILL, 1);
    awaitListed(Role.DECODE, 1);
    ActorRef<RouterActor.Command> router = kit.spawn(RouterActor.create());
    TestProbe<RouterActor.Routed> client = kit.createTestProbe();
    awaitRoutable(kit, router, 1, 1);
    router.tell(new RouterActor.Route(spec("r1"), TransferMode.WRITE, client.ref()));
    EngineService.Submit toP = p.receiveMessage(Duration.ofSeconds(3));
    EngineService.Submit toD = d.receiveMessage(Duration.ofSeconds(3));
    toP.replyTo().tell(new Outcome("r1", "p0", Role.PREFILL, prefill, null, 0, 0,
        "prefill says " + prefill));
    toD.replyTo().tell(new Outcome("r1", "d0", Role.DECODE, decode, null, 10, 5,
        "decode says " + decode));
    return client.receiveMessage(Duration.ofSeconds(3));
  }

  @Test
  void aMismatchAtDecodeIsReportedAsAMismatchEvenWhenPrefillAborted() {
    RouterActor.Routed routed =
        routeAnsweredWith(Outcome.Status.ABORTED, Outcome.Status.MISMATCH);
    assertEquals(Outcome.Status.MISMATCH, routed.status());
    assertEquals("decode says MISMATCH", routed.detail());
  }

  @Test
  void anAbortOnPrefillIsReportedAsAnAbortWithBothSidesDetail() {
    RouterActor.Routed routed = routeAnsweredWith(Outcome.Status.ABORTED, Outcome.Status.FAILED);
    assertEquals(Outcome.Status.ABORTED, routed.status());
    assertEquals("prefill says ABORTED; decode: decode says FAILED", routed.detail());
  }

  @Test
  void picksTheLeastLoadedEngineAndOnlyEnginesOfTheAskedMode() {
    TestProbe<EngineService.Submit> p0 = kit.createTestProbe();
    TestProbe<EngineService.Submit> p1 = kit.createTestProbe();
    TestProbe<EngineService.Submit> pRead = kit.createTestProbe();
    TestProbe<EngineService.Submit> d = kit.createTestProbe();
    engine(Role.PREFILL, "p0", TransferMode.WRITE, p0);
    engine(Role.PREFILL, "p1", TransferMode.WRITE, p1);
    engine(Role.PREFILL, "p-read", TransferMode.READ, pRead);
    engine(Role.DECODE, "d0", TransferMode.WRITE, d);
    awaitListed(Role.PREFILL, 3);
    awaitListed(Role.DECODE, 1);
    ActorRef<RouterActor.Command> router = kit.spawn(RouterActor.create());
    TestProbe<RouterActor.Routed> client = kit.createTestProbe();
    awaitRoutable(kit, router, 3, 1);
    router.tell(new RouterActor.Route(spec("no-read-decode"), TransferMode.READ, client.ref()));
    RouterActor.Routed none = client.receiveMessage(Duration.ofSeconds(3));
    assertTrue(none.detail().contains("no decode engine in read mode"), none.detail());
    for (int i = 0; i < 4; i++) {
      router.tell(new RouterActor.Route(spec("w" + i), TransferMode.WRITE, client.ref()));
    }
    // Two engines with equal load: the four requests split two and two.
    assertEquals(2, p0.receiveSeveralMessages(2, Duration.ofSeconds(3)).size());
    assertEquals(2, p1.receiveSeveralMessages(2, Duration.ofSeconds(3)).size());
    p0.expectNoMessage(Duration.ofMillis(100));
    pRead.expectNoMessage(Duration.ofMillis(100));
  }

  @Test
  void requestsOnAnEngineThatLeavesFailAtOnce() {
    TestProbe<EngineService.Submit> p = kit.createTestProbe();
    TestProbe<EngineService.Submit> d = kit.createTestProbe();
    engine(Role.PREFILL, "p0", TransferMode.WRITE, p);
    ActorRef<EngineService.Command> decode = engine(Role.DECODE, "d0", TransferMode.WRITE, d);
    awaitListed(Role.PREFILL, 1);
    awaitListed(Role.DECODE, 1);
    ActorRef<RouterActor.Command> router = kit.spawn(RouterActor.create());
    TestProbe<RouterActor.Routed> client = kit.createTestProbe();
    awaitRoutable(kit, router, 1, 1);
    router.tell(new RouterActor.Route(spec("held"), TransferMode.WRITE, client.ref()));
    d.receiveMessage(Duration.ofSeconds(3));
    kit.stop(decode);
    RouterActor.Routed routed = client.receiveMessage(Duration.ofSeconds(5));
    assertEquals(Outcome.Status.FAILED, routed.status());
    assertTrue(routed.detail().contains("d0 left the cluster"), routed.detail());
  }
}
