package dev.kvferry.it;

import dev.kvferry.engine.EngineService;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.typesafe.config.ConfigFactory;
import dev.kvferry.actors.EngineActor;
import dev.kvferry.actors.TransferSnapshot;
import dev.kvferry.actors.connector.ConnectorScheduler;
import dev.kvferry.actors.connector.ConnectorWorker;
import dev.kvferry.actors.connector.Role;
import dev.kvferry.actors.connector.TransferMode;
import dev.kvferry.actors.engine.ConnectorSettings;
import dev.kvferry.actors.engine.EngineIdentity;
import dev.kvferry.actors.plan.KvCacheGeometry;
import dev.kvferry.rdma.LocalTransport;
import dev.kvferry.rdma.MemoryRegion;
import dev.kvferry.rdma.RegionRegistry;
import dev.kvferry.router.RouterActor;
import dev.kvferry.engine.RequestSpec;
import dev.kvferry.sim.SimEngineActor;
import dev.kvferry.engine.EngineService.Outcome;
import dev.kvferry.sim.SimulatedEngine;
import java.lang.management.ManagementFactory;
import java.time.Clock;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Random;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.Semaphore;
import java.util.concurrent.TimeUnit;
import org.apache.pekko.actor.testkit.typed.javadsl.ActorTestKit;
import org.apache.pekko.actor.typed.ActorRef;
import org.apache.pekko.actor.typed.Props;
import org.apache.pekko.actor.typed.javadsl.AskPattern;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;

/**
 * A bounded load run through the demo's own router and simulated engines, in one JVM over the local
 * transport: thousands of requests in both modes with random prompt lengths, prefix hits and
 * aborts of every kind, many in flight at once. At the end: every request ended (done or
 * aborted), no byte mismatched, no transfer failed, every block is back on every engine, no
 * transfer is left open in any tracker, and the heap after the run is within a bound of the heap
 * after the warm-up.
 *
 * <p>{@code kvferry.load.requests} sets the number of requests per mode (default 1000).
 */
class InProcessLoadTest {

  private static final int LAYERS = 3;
  private static final int REQUESTS_PER_MODE = Integer.getInteger("kvferry.load.requests", 1000);
  private static final int CONCURRENCY = 16;
  /**
   * Each tracker remembers finished transfer ids (to ignore late messages) up to its
   * terminal-id capacity: with the default 65,536 the heap grows with every request of this run
   * by design. A capacity the warm-up fills leaves nothing that may grow (measured here: 241 KiB
   * over the 1,500 requests after the warm-up, 378 KiB over 6,000), so a leak of 1 KiB per request
   * exceeds the bound.
   */
  private static final ConnectorSettings SETTINGS = withTerminalIdCapacity(
      ConnectorSettings.DEFAULTS, 64);
  private static final long HEAP_GROWTH_BOUND_BYTES = 1L << 20;

  private final ActorTestKit kit =
      ActorTestKit.create(ConfigFactory.parseString("pekko.loglevel = ERROR")
          .withFallback(ConfigFactory.load()));
  private final List<AutoCloseable> closeables = new ArrayList<>();
  private final List<SimulatedEngine> engines = new ArrayList<>();
  private final List<ConnectorWorker> workers = new ArrayList<>();

  @AfterEach
  void stop() throws Exception {
    for (AutoCloseable c : closeables) {
      c.close();
    }
    kit.shutdownTestKit();
  }

  private void engine(Role role, TransferMode mode, String id, KvCacheGeometry g,
      RegionRegistry registry, LocalTransport transport) {
    List<MemoryRegion> layers = new ArrayList<>();
    for (int l = 0; l < LAYERS; l++) {
      layers.add(registry.allocateHost(g.layerRegionBytes()));
    }
    EngineIdentity identity = new EngineIdentity(role, id, 0, 1, 0, 1, mode);
    ConnectorWorker w = new ConnectorWorker(kit.system(), identity, transport, SETTINGS);
    w.registerKvCaches(g, layers);
    ConnectorScheduler s = new ConnectorScheduler(role, mode, id, 0, g.blockSize(),
        List.of(w.engineRef()), SETTINGS, Clock.systemUTC());
    SimulatedEngine e = new SimulatedEngine(role, id, g, layers, s, w, 96, id.hashCode());
    e.start();
    // Named as nodes name it, so the router reads the engine's identity from the listing.
    kit.system().systemActorOf(SimEngineActor.create(e), "sim~" + identity.toActorName(), Props.empty());
    closeables.add(e);
    closeables.add(w);
    engines.add(e);
    workers.add(w);
  }

  private static int count(
      Map<Outcome.Status, java.util.concurrent.atomic.AtomicInteger> counts, Outcome.Status s) {
    java.util.concurrent.atomic.AtomicInteger n = counts.get(s);
    return n == null ? 0 : n.get();
  }

  /** Waits until every request sent so far was answered (all of the window's permits free). */
  private static void awaitAllAnswered(Semaphore window, int seconds) throws InterruptedException {
    assertTrue(window.tryAcquire(CONCURRENCY, seconds, TimeUnit.SECONDS),
        "requests still unanswered after " + seconds + " s");
    window.release(CONCURRENCY);
  }

  private static ConnectorSettings withTerminalIdCapacity(ConnectorSettings s, int capacity) {
    return new ConnectorSettings(s.handshakeTimeout(), s.handshakeAttempts(),
        s.handshakeBackoff(), s.deferTimeout(), s.transferTimeout(), s.readAbortTimeout(),
        capacity, s.readsAtAdmission(), s.reattachGrace());
  }

  private static long heapAfterGc() {
    System.gc();
    return ManagementFactory.getMemoryMXBean().getHeapMemoryUsage().getUsed();
  }

  @Test
  void thousandsOfRequestsWithRandomAbortsLeaveNoBlockNoTransferAndNoMismatchBehind() throws Exception {
    RegionRegistry pRegistry = new RegionRegistry("prefill");
    RegionRegistry dRegistry = new RegionRegistry("decode");
    closeables.add(pRegistry);
    closeables.add(dRegistry);
    LocalTransport transport = new LocalTransport(pRegistry, dRegistry);
    KvCacheGeometry p = KvCacheGeometry.standard(256, 4, 2, 16, 2);
    KvCacheGeometry d = KvCacheGeometry.standard(200, 4, 2, 16, 2);
    for (TransferMode mode : TransferMode.values()) {
      engine(Role.PREFILL, mode, "prefill-" + mode.configName(), p, pRegistry, transport);
      engine(Role.DECODE, mode, "decode-" + mode.configName(), d, dRegistry, transport);
    }
    ActorRef<RouterActor.Command> router = kit.spawn(RouterActor.create(), "router");
    kit.createTestProbe().awaitAssert(Duration.ofSeconds(20), Duration.ofMillis(50), () -> {
      RouterActor.Routed r = route(router, new RequestSpec("probe-" + System.nanoTime(), 8, 0,
          RequestSpec.Abort.NONE), TransferMode.READ).get(20, TimeUnit.SECONDS);
      assertEquals(Outcome.Status.DONE, r.status(), r.detail());
      return null;
    });

    Random random = new Random(2026);
    // Counted as answers come, so the test itself holds nothing per request (the heap check
    // below would count a list of results as growth).
    Map<Outcome.Status, java.util.concurrent.atomic.AtomicInteger> counts =
        new java.util.concurrent.ConcurrentHashMap<>();
    ConcurrentLinkedQueue<String> problems = new ConcurrentLinkedQueue<>();
    long heapAfterWarmUp = 0;
    int total = 2 * REQUESTS_PER_MODE;
    Semaphore window = new Semaphore(CONCURRENCY);
    RequestSpec.Abort[] aborts = RequestSpec.Abort.values();
    for (int i = 0; i < total; i++) {
      if (i == total / 4) {
        awaitAllAnswered(window, 120);
        heapAfterWarmUp = heapAfterGc();
      }
      TransferMode mode = random.nextBoolean() ? TransferMode.WRITE : TransferMode.READ;
      int prompt = 1 + random.nextInt(150);
      int cached = random.nextInt(4) == 0 ? (random.nextInt(prompt) / 4) * 4 : 0;
      RequestSpec.Abort abort = random.nextInt(5) == 0 ? aborts[1 + random.nextInt(aborts.length - 1)]
          : RequestSpec.Abort.NONE;
      window.acquire();
      String id = "load-" + i;
      route(router, new RequestSpec(id, prompt, cached, abort), mode)
          .handle((r, error) -> {
            Outcome.Status status = r != null ? r.status() : Outcome.Status.FAILED;
            counts.computeIfAbsent(status, k -> new java.util.concurrent.atomic.AtomicInteger())
                .incrementAndGet();
            if (status == Outcome.Status.FAILED || status == Outcome.Status.MISMATCH) {
              problems.add(id + " " + status + ": " + (r != null ? r.detail() : "no answer: " + error));
            }
            window.release();
            return null;
          });
    }
    awaitAllAnswered(window, 300);

    int answered = counts.values().stream().mapToInt(java.util.concurrent.atomic.AtomicInteger::get).sum();
    System.out.printf("load: %d requests: %s%n", total, counts);
    assertEquals(total, answered);
    assertTrue(problems.isEmpty(), problems.size() + " problems, first: "
        + problems.stream().limit(5).toList());
    assertTrue(count(counts, Outcome.Status.ABORTED) > 0, "aborts were exercised");
    assertTrue(count(counts, Outcome.Status.DONE) > total / 2, "most requests finished");

    for (SimulatedEngine e : engines) {
      kit.createTestProbe().awaitAssert(Duration.ofSeconds(20), Duration.ofMillis(50), () -> {
        EngineService.Stats s = e.stats();
        assertEquals(s.numBlocks(), s.freeBlocks(), e.engineId() + " leaked blocks");
        assertEquals(0, s.requestsInFlight(), e.engineId() + " requests in flight");
        return null;
      });
    }
    for (ConnectorWorker w : workers) {
      TransferSnapshot s = AskPattern.<EngineActor.Command, TransferSnapshot>ask(
              w.engineRef(), EngineActor.GetTransfers::new, Duration.ofSeconds(5), kit.scheduler())
          .toCompletableFuture().get(10, TimeUnit.SECONDS);
      assertTrue(s.transfers().isEmpty(), w.identity().label() + " has open transfers: " + s.countsByState());
    }
    long heapAtEnd = heapAfterGc();
    System.out.printf("load: heap after warm-up %d KiB, at end %d KiB, growth %d KiB%n",
        heapAfterWarmUp >> 10, heapAtEnd >> 10, (heapAtEnd - heapAfterWarmUp) >> 10);
    assertTrue(heapAtEnd - heapAfterWarmUp < HEAP_GROWTH_BOUND_BYTES,
        "heap grew by " + ((heapAtEnd - heapAfterWarmUp) >> 20) + " MiB over the run");
  }

  private CompletableFuture<RouterActor.Routed> route(ActorRef<RouterActor.Command> router,
      RequestSpec spec, TransferMode mode) {
    return AskPattern.<RouterActor.Command, RouterActor.Routed>ask(router,
            to -> new RouterActor.Route(spec, mode, to), Duration.ofSeconds(60), kit.scheduler())
        .toCompletableFuture();
  }
}
