package dev.kvferry.it;

import dev.kvferry.engine.EngineService;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.typesafe.config.ConfigFactory;
import dev.kvferry.actors.EngineActor;
import dev.kvferry.actors.PeerProtocol;
import dev.kvferry.actors.connector.ConnectorScheduler;
import dev.kvferry.actors.connector.ConnectorWorker;
import dev.kvferry.actors.connector.KvTransferParams;
import dev.kvferry.actors.connector.Role;
import dev.kvferry.actors.connector.TransferMode;
import dev.kvferry.actors.engine.ConnectorSettings;
import dev.kvferry.actors.engine.EngineIdentity;
import dev.kvferry.actors.plan.KvCacheGeometry;
import dev.kvferry.rdma.LocalTransport;
import dev.kvferry.rdma.MemoryRegion;
import dev.kvferry.rdma.RegionRegistry;
import dev.kvferry.engine.RequestSpec;
import dev.kvferry.engine.EngineService.Outcome;
import dev.kvferry.sim.SimulatedEngine;
import java.nio.charset.StandardCharsets;
import java.time.Clock;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.function.Supplier;
import java.util.stream.IntStream;
import org.apache.pekko.actor.testkit.typed.javadsl.ActorTestKit;
import org.apache.pekko.actor.testkit.typed.javadsl.TestProbe;
import org.apache.pekko.actor.typed.ActorRef;
import org.apache.pekko.actor.typed.javadsl.Behaviors;
import org.apache.pekko.actor.typed.receptionist.Receptionist;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;

/**
 * Handshake targets that misbehave, with a real simulated engine on our side: one that is listed
 * and accepts messages but never answers the metadata request, and ones that answer with garbage.
 * The requests waiting on them fail within the handshake's own timeout (every other connector
 * timeout is ten minutes away), with a reason that names the peer, and every block goes back.
 */
class HandshakePeerFaultsTest {

  private static final int LAYERS = 2;
  private static final KvCacheGeometry GEOMETRY = KvCacheGeometry.standard(64, 4, 2, 8, 2);
  /** Two attempts of 300 ms: waiting requests fail well under a second or two. */
  private static final ConnectorSettings SETTINGS =
      ConnectorSettings.DEFAULTS
          .withHandshake(Duration.ofMillis(300), 2, Duration.ofMillis(100))
          .withDeferTimeout(Duration.ofMinutes(10))
          .withTransferTimeout(Duration.ofMinutes(10))
          .withReadAbortTimeout(Duration.ofMinutes(10));
  /** Far below the ten-minute timeouts, far above 2 x 300 ms on a loaded host. */
  private static final Duration FAILS_WITHIN = Duration.ofSeconds(20);

  private final ActorTestKit kit =
      ActorTestKit.create(
          ConfigFactory.parseString("pekko.loglevel = ERROR").withFallback(ConfigFactory.load()));
  private final List<AutoCloseable> closeables = new ArrayList<>();

  @AfterEach
  void stop() throws Exception {
    for (AutoCloseable c : closeables) {
      c.close();
    }
    kit.shutdownTestKit();
  }

  /** A simulated engine with its worker, over the local transport. */
  private SimulatedEngine engine(Role role, TransferMode mode, String id) {
    RegionRegistry registry = new RegionRegistry(id);
    closeables.add(registry);
    return engine(role, mode, id, registry, registry);
  }

  /** The same on {@code registry}, whose transport reaches {@code reachable}. */
  private SimulatedEngine engine(Role role, TransferMode mode, String id, RegionRegistry registry,
      RegionRegistry... reachable) {
    List<MemoryRegion> layers = new ArrayList<>();
    for (int l = 0; l < LAYERS; l++) {
      layers.add(registry.allocateHost(GEOMETRY.layerRegionBytes()));
    }
    ConnectorWorker w = new ConnectorWorker(kit.system(),
        new EngineIdentity(role, id, 0, 1, 0, 1, mode), new LocalTransport(reachable), SETTINGS);
    w.registerKvCaches(GEOMETRY, layers);
    ConnectorScheduler s = new ConnectorScheduler(role, mode, id, 0, GEOMETRY.blockSize(),
        List.of(w.engineRef()), SETTINGS, Clock.systemUTC());
    SimulatedEngine e = new SimulatedEngine(role, id, GEOMETRY, layers, s, w, 64, 3);
    e.start();
    closeables.add(e);
    closeables.add(w);
    return e;
  }

  /**
   * A listed engine that answers the handshake with {@code blob} (never, when it supplies null);
   * everything else it is sent lands in {@code inbox}.
   */
  private void peer(EngineIdentity identity, Supplier<byte[]> blob, ActorRef<EngineActor.Command> inbox) {
    kit.spawn(Behaviors.<EngineActor.Command>setup(ctx -> {
      ctx.getSystem().receptionist()
          .tell(Receptionist.register(EngineActor.serviceKey(identity.role()), ctx.getSelf()));
      return Behaviors.receive(EngineActor.Command.class)
          .onMessage(PeerProtocol.GetMetadata.class, m -> {
            byte[] b = blob.get();
            if (b != null) {
              m.replyTo().tell(new PeerProtocol.MetadataReply(identity.engineId(), 0, b));
            }
            return Behaviors.same();
          })
          .onAnyMessage(m -> {
            inbox.tell(m);
            return Behaviors.same();
          })
          .build();
    }), identity.toActorName());
  }

  private void awaitAllFree(SimulatedEngine e) {
    kit.createTestProbe().awaitAssert(FAILS_WITHIN, Duration.ofMillis(20), () -> {
      EngineService.Stats s = e.stats();
      assertEquals(s.numBlocks(), s.freeBlocks(), e.engineId() + ": every block back");
      assertEquals(0, s.requestsInFlight(), e.engineId() + ": nothing in flight");
      return null;
    });
  }

  @Test
  void writesWaitingOnADecodeThatNeverAnswersTheHandshakeFailAndFreePrefillBlocks() {
    EngineIdentity silent = new EngineIdentity(Role.DECODE, "silent-decode", 0, 1, 0, 1, TransferMode.WRITE);
    TestProbe<EngineActor.Command> inbox = kit.createTestProbe();
    peer(silent, () -> null, inbox.ref());
    SimulatedEngine p = engine(Role.PREFILL, TransferMode.WRITE, "prefill");
    TestProbe<Outcome> outcomes = kit.createTestProbe();
    for (int i = 0; i < 3; i++) {
      p.submit(new EngineService.Submit(new RequestSpec("w" + i, 30, 0, RequestSpec.Abort.NONE),
          KvTransferParams.forPrefill("tx-w" + i, "silent-decode", 0), outcomes.ref()));
    }
    // D's failure notices name the handshake that did not answer.
    for (int i = 0; i < 3; i++) {
      PeerProtocol.TransferFailed f =
          inbox.expectMessageClass(PeerProtocol.TransferFailed.class, FAILS_WITHIN);
      assertEquals("handshake with silent-decode/tp0 failed after 2 attempts: no answer from"
          + " silent-decode/tp0 within 300 ms", f.reason());
    }
    awaitAllFree(p);
  }

  @Test
  void readsFromAPrefillThatNeverAnswersTheHandshakeFailNamingItAndFreeDecodeBlocks() {
    EngineIdentity silent = new EngineIdentity(Role.PREFILL, "silent-prefill", 0, 1, 0, 1, TransferMode.READ);
    TestProbe<EngineActor.Command> inbox = kit.createTestProbe();
    peer(silent, () -> null, inbox.ref());
    SimulatedEngine d = engine(Role.DECODE, TransferMode.READ, "decode");
    TestProbe<Outcome> outcomes = kit.createTestProbe();
    for (int i = 0; i < 3; i++) {
      d.submit(new EngineService.Submit(new RequestSpec("r" + i, 40, 0, RequestSpec.Abort.NONE),
          readParams("tx-r" + i, "silent-prefill", 10), outcomes.ref()));
    }
    for (int i = 0; i < 3; i++) {
      Outcome o = outcomes.expectMessageClass(Outcome.class, FAILS_WITHIN);
      assertEquals(Outcome.Status.FAILED, o.status(), o.toString());
      assertEquals("handshake with silent-prefill/tp0 failed after 2 attempts: no answer from"
          + " silent-prefill/tp0 within 300 ms", o.detail());
    }
    // D still lets the silent P know it may free what it kept.
    for (int i = 0; i < 3; i++) {
      inbox.expectMessageClass(PeerProtocol.Release.class, FAILS_WITHIN);
    }
    awaitAllFree(d);
  }

  @Test
  void garbageAndMisnamedMetadataFailTheHandshakeWithAClearReasonAndDecodeKeepsServing() {
    RegionRegistry pRegistry = new RegionRegistry("prefill");
    RegionRegistry dRegistry = new RegionRegistry("decode");
    closeables.add(pRegistry);
    closeables.add(dRegistry);
    SimulatedEngine d =
        engine(Role.DECODE, TransferMode.READ, "decode", dRegistry, dRegistry, pRegistry);
    byte[] noise = new byte[512];
    new java.util.Random(7).nextBytes(noise);
    record Case(String engineId, byte[] blob, String reason) {}
    List<Case> cases = List.of(
        new Case("noise-prefill", noise, "malformed agent metadata:"
            + " org.msgpack.core.MessageTypeException: Expected Map, but got Array (99)"),
        new Case("text-prefill", "{\"engine_id\": \"x\"}".getBytes(StandardCharsets.UTF_8),
            "malformed agent metadata:"
                + " org.msgpack.core.MessageTypeException: Expected Map, but got Integer (7b)"),
        new Case("empty-prefill", new byte[0], "agent metadata of 0 bytes refused"),
        new Case("huge-prefill", new byte[5 << 20], "agent metadata of 5242880 bytes refused"),
        new Case("impostor-prefill", impostorMetadata(),
            "asked impostor-prefill/tp0 but its metadata names someone-else/tp0"));
    TestProbe<EngineActor.Command> inbox = kit.createTestProbe();
    for (Case c : cases) {
      peer(new EngineIdentity(Role.PREFILL, c.engineId(), 0, 1, 0, 1, TransferMode.READ),
          c::blob, inbox.ref());
      TestProbe<Outcome> outcome = kit.createTestProbe();
      // Retried until the peer is listed: the handshake then fails on the blob, not on the listing.
      outcome.awaitAssert(FAILS_WITHIN, Duration.ofMillis(50), () -> {
        TestProbe<Outcome> one = kit.createTestProbe();
        d.submit(new EngineService.Submit(new RequestSpec(c.engineId() + "-" + System.nanoTime(), 12, 0,
            RequestSpec.Abort.NONE), readParams("tx-" + System.nanoTime(), c.engineId(), 3), one.ref()));
        Outcome o = one.expectMessageClass(Outcome.class, FAILS_WITHIN);
        assertEquals(Outcome.Status.FAILED, o.status(), o.toString());
        assertEquals("handshake with " + c.engineId() + "/tp0 failed: " + c.reason(),
            o.detail());
        return null;
      });
    }
    awaitAllFree(d);
    // D keeps serving: a real prefill engine's request is read and verified byte for byte.
    SimulatedEngine p =
        engine(Role.PREFILL, TransferMode.READ, "prefill", pRegistry, pRegistry, dRegistry);
    TestProbe<Outcome> outcome = kit.createTestProbe();
    RequestSpec good = new RequestSpec("good", 40, 0, RequestSpec.Abort.NONE);
    outcome.awaitAssert(FAILS_WITHIN, Duration.ofMillis(50), () -> {
      String tx = "tx-good-" + System.nanoTime();
      TestProbe<Outcome> pOut = kit.createTestProbe();
      p.submit(new EngineService.Submit(good, KvTransferParams.forPrefill(tx, "decode", 0),
          pOut.ref()));
      Outcome prefilled = pOut.expectMessageClass(Outcome.class, FAILS_WITHIN);
      assertEquals(Outcome.Status.DONE, prefilled.status(), prefilled.toString());
      TestProbe<Outcome> dOut = kit.createTestProbe();
      d.submit(new EngineService.Submit(good, prefilled.paramsForPeer(), dOut.ref()));
      Outcome read = dOut.expectMessageClass(Outcome.class, FAILS_WITHIN);
      assertEquals(Outcome.Status.DONE, read.status(), read.toString());
      assertTrue(read.bytes() > 0, read.toString());
      return null;
    });
    awaitAllFree(d);
    awaitAllFree(p);
  }

  /** Valid metadata, but of another engine than the one asked. */
  private byte[] impostorMetadata() {
    RegionRegistry registry = new RegionRegistry("someone-else");
    closeables.add(registry);
    List<dev.kvferry.rdma.RegionDescriptor> layers = new ArrayList<>();
    for (int l = 0; l < LAYERS; l++) {
      layers.add(registry.allocateHost(GEOMETRY.layerRegionBytes()).descriptor());
    }
    return new dev.kvferry.actors.engine.AgentMetadata(
        "someone-else", 0, 0, 1, "local", GEOMETRY, layers).pack();
  }

  /** What a READ-mode P hands D: its engine and the block ids to read. */
  private static KvTransferParams readParams(String transferId, String prefillEngineId, int blocks) {
    int[] ids = IntStream.range(0, blocks).toArray();
    return new KvTransferParams(true, false, transferId, prefillEngineId, 0,
        Arrays.copyOf(ids, ids.length), "", 0, 1);
  }
}
