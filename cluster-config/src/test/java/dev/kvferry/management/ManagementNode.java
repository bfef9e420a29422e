package dev.kvferry.management;

import com.typesafe.config.Config;
import com.typesafe.config.ConfigFactory;
import dev.kvferry.actors.EngineActor;
import dev.kvferry.actors.connector.ConnectorWorker;
import dev.kvferry.actors.connector.ReqMeta;
import dev.kvferry.actors.connector.Role;
import dev.kvferry.actors.connector.TransferMode;
import dev.kvferry.actors.engine.ConnectorSettings;
import dev.kvferry.actors.engine.EngineIdentity;
import dev.kvferry.actors.plan.KvCacheGeometry;
import dev.kvferry.node.KvferryConfig;
import dev.kvferry.node.NodeRuntime;
import dev.kvferry.rdma.LocalTransport;
import dev.kvferry.rdma.RegionRegistry;
import java.io.IOException;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.time.Duration;
import java.util.List;
import java.util.Map;
import org.apache.pekko.actor.testkit.typed.javadsl.ActorTestKit;
import org.apache.pekko.actor.testkit.typed.javadsl.FishingOutcomes;
import org.apache.pekko.actor.testkit.typed.javadsl.TestProbe;
import org.apache.pekko.actor.typed.ActorRef;
import org.apache.pekko.actor.typed.javadsl.Behaviors;
import org.apache.pekko.actor.typed.receptionist.Receptionist;
import org.apache.pekko.cluster.typed.Cluster;
import org.apache.pekko.cluster.typed.Join;
import org.apache.pekko.cluster.typed.SelfUp;
import org.apache.pekko.cluster.typed.Subscribe;

/**
 * A real one-node cluster for the management tests, configured as kvferry processes are
 * ({@link KvferryConfig}) plus: artery and management HTTP on loopback and free ports, kvferry's
 * routes and readiness check registered (as kvferry-pekko.conf is to register them). It
 * runs a real decode worker ({@link #DECODE}) with one receive in flight ("req-1"/"xfer-1" from
 * an absent prefill engine) and lists a prefill engine ({@link #PREFILL}) registered by name only.
 * Started once for all test classes by {@link ManagementNodeExtension}: starting a cluster node
 * and its HTTP server takes seconds on a small machine.
 */
public final class ManagementNode implements AutoCloseable {

  static final EngineIdentity DECODE =
      new EngineIdentity(Role.DECODE, "decode-a", 0, 1, 0, 1, TransferMode.WRITE);
  static final EngineIdentity PREFILL =
      new EngineIdentity(Role.PREFILL, "prefill-b", 1, 2, 0, 1, TransferMode.READ);

  private static final KvCacheGeometry GEOMETRY = KvCacheGeometry.standard(8, 4, 2, 8, 2);

  static final Config CONFIG =
      ConfigFactory.parseString(
          """
          pekko.loglevel = WARNING
          pekko.actor.provider = cluster
          pekko.remote.artery.canonical { hostname = "127.0.0.1", port = 0 }
          pekko.cluster.seed-nodes = []
          pekko.cluster.jmx.multi-mbeans-in-same-jvm = on
          pekko.coordinated-shutdown.exit-jvm = off
          pekko.coordinated-shutdown.run-by-jvm-shutdown-hook = off
          pekko.management.http { hostname = "127.0.0.1", bind-hostname = "127.0.0.1", port = 0 }
          pekko.management.http.routes.kvferry = "dev.kvferry.management.KvferryRoutes"
          pekko.management.health-checks.readiness-checks.kvferry =
              "dev.kvferry.management.KvferryReadinessCheck"
          kvferry.management.ask-timeout = 3s
          """);

  final ActorTestKit kit;
  final TestRuntime runtime;
  final URI management;
  private final RegionRegistry regions;
  private final HttpClient http = HttpClient.newHttpClient();

  private ManagementNode(
      ActorTestKit kit, TestRuntime runtime, RegionRegistry regions, URI management) {
    this.kit = kit;
    this.runtime = runtime;
    this.regions = regions;
    this.management = management;
  }

  /** Starts the system, joins it to itself, waits until it is Up, adds the engines, starts HTTP. */
  public static ManagementNode start() throws ManagementStartException {
    ActorTestKit kit =
        ActorTestKit.create("kvferry", CONFIG.withFallback(KvferryConfig.load(Map.of())));
    Cluster cluster = Cluster.get(kit.system());
    TestProbe<SelfUp> up = kit.createTestProbe(SelfUp.class);
    cluster.subscriptions().tell(Subscribe.create(up.ref(), SelfUp.class));
    cluster.manager().tell(Join.create(cluster.selfMember().address()));
    up.expectMessageClass(SelfUp.class, Duration.ofSeconds(30));

    TestRuntime runtime = new TestRuntime(kit.system());
    NodeRuntime.register(runtime);
    RegionRegistry regions = new RegionRegistry(DECODE.engineId());
    ConnectorWorker decode =
        new ConnectorWorker(
            kit.system(),
            DECODE,
            new LocalTransport(regions),
            // The receive below must still be in flight whenever a test reads it.
            ConnectorSettings.DEFAULTS.withTransferTimeout(Duration.ofHours(1)),
            runtime.metrics());
    decode.registerKvCaches(GEOMETRY, List.of(regions.allocateHost(GEOMETRY.layerRegionBytes())));
    runtime.workers.add(decode);
    decode
        .engineRef()
        .tell(
            new EngineActor.AnnounceRemoteBlocks(
                new ReqMeta("req-1", "xfer-1", new int[] {0, 1}, null, "prefill-absent", 0)));

    ActorRef<EngineActor.Command> prefill =
        kit.spawn(
            Behaviors.<EngineActor.Command>setup(
                ctx -> {
                  ctx.getSystem()
                      .receptionist()
                      .tell(
                          Receptionist.register(
                              EngineActor.serviceKey(Role.PREFILL), ctx.getSelf()));
                  return Behaviors.ignore();
                }),
            PREFILL.toActorName());
    awaitListed(kit, Role.PREFILL, prefill);
    awaitListed(kit, Role.DECODE, decode.engineRef());
    return new ManagementNode(kit, runtime, regions, ManagementServer.start(kit.system()));
  }

  /** Waits until the Receptionist lists {@code ref}: registration is asynchronous. */
  private static void awaitListed(
      ActorTestKit kit, Role role, ActorRef<EngineActor.Command> ref) {
    TestProbe<Receptionist.Listing> probe = kit.createTestProbe(Receptionist.Listing.class);
    kit.system()
        .receptionist()
        .tell(Receptionist.subscribe(EngineActor.serviceKey(role), probe.ref()));
    probe.fishForMessage(
        Duration.ofSeconds(30),
        listing ->
            listing.getServiceInstances(EngineActor.serviceKey(role)).contains(ref)
                ? FishingOutcomes.complete()
                : FishingOutcomes.continueAndIgnore());
  }

  /** host:port of the management server, as {@code kvferry status --management} takes it. */
  public String hostPort() {
    return management.getHost() + ":" + management.getPort();
  }

  /** This node's cluster address, as the engines listing shows it. */
  public String clusterAddress() {
    return Cluster.get(kit.system()).selfMember().address().toString();
  }

  public HttpResponse<String> get(String path) throws IOException, InterruptedException {
    return http.send(
        HttpRequest.newBuilder(management.resolve(path)).GET().build(),
        HttpResponse.BodyHandlers.ofString());
  }

  @Override
  public void close() {
    for (ConnectorWorker w : runtime.workers) {
      w.shutdown();
    }
    NodeRuntime.unregister(runtime);
    kit.shutdownTestKit();
    regions.close();
  }
}
