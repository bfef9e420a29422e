package dev.kvferry.actors;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.typesafe.config.ConfigFactory;
import dev.kvferry.actors.connector.ConnectorMetadata;
import dev.kvferry.actors.connector.ConnectorWorker;
import dev.kvferry.actors.connector.Finished;
import dev.kvferry.actors.connector.HostLayerEvent;
import dev.kvferry.actors.connector.ReqMeta;
import dev.kvferry.actors.connector.Role;
import dev.kvferry.actors.connector.TransferMode;
import dev.kvferry.actors.engine.AgentMetadata;
import dev.kvferry.actors.engine.ConnectorSettings;
import dev.kvferry.actors.engine.EngineIdentity;
import dev.kvferry.actors.plan.KvCacheGeometry;
import dev.kvferry.rdma.LocalTransport;
import dev.kvferry.rdma.MemoryRegion;
import dev.kvferry.rdma.RegionDescriptor;
import dev.kvferry.rdma.RegionRegistry;
import dev.kvferry.rdma.Transport;
import java.nio.ByteBuffer;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.function.Function;
import org.apache.pekko.actor.testkit.typed.javadsl.ActorTestKit;
import org.apache.pekko.actor.testkit.typed.javadsl.TestProbe;
import org.apache.pekko.actor.typed.ActorRef;
import org.apache.pekko.actor.typed.Behavior;
import org.apache.pekko.actor.typed.javadsl.Behaviors;
import org.apache.pekko.actor.typed.receptionist.Receptionist;

/**
 * One real worker and a peer the test plays by hand: the peer is an actor registered under an
 * engine's name and service key, so the worker finds it in its directory like any engine, and it
 * answers the handshake however the test says (real metadata, garbage, nothing). Messages the
 * worker sends the peer land in {@link #peerInbox}.
 */
final class PeerFixture implements AutoCloseable {

  static final int LAYERS = 2;
  static final int BLOCK = 4;
  static final KvCacheGeometry GEOMETRY = KvCacheGeometry.standard(16, BLOCK, 2, 8, 2);

  final ActorTestKit kit;
  final RegionRegistry localRegistry = new RegionRegistry("local");
  final RegionRegistry peerRegistry = new RegionRegistry("peer");
  final List<MemoryRegion> localLayers = new ArrayList<>();
  final List<MemoryRegion> peerLayers = new ArrayList<>();
  final Transport transport = new LocalTransport(localRegistry, peerRegistry);
  final TestProbe<EngineActor.Command> peerInbox;
  private final List<ConnectorWorker> workers = new ArrayList<>();

  PeerFixture() {
    kit =
        ActorTestKit.create(
            ConfigFactory.parseString(
                    "pekko.actor.serialize-messages = on\npekko.loglevel = ERROR")
                .withFallback(ConfigFactory.load()));
    peerInbox = kit.createTestProbe();
    for (int l = 0; l < LAYERS; l++) {
      MemoryRegion local = localRegistry.allocateHost(GEOMETRY.layerRegionBytes());
      fill(local, l);
      localLayers.add(local);
      peerLayers.add(peerRegistry.allocateHost(GEOMETRY.layerRegionBytes()));
    }
  }

  /** Fills P's layer {@code layer} with {@link #patternByte}. */
  static void fill(MemoryRegion r, int layer) {
    ByteBuffer b = r.buffer(0, (int) r.lengthBytes());
    for (int i = 0; i < b.capacity(); i++) {
      b.put(i, patternByte(layer, i));
    }
  }

  /**
   * The byte P's layer {@code layer} holds at {@code offsetBytes}: a hash of both, so a block
   * written from the wrong source block, layer, K|V half or position reads differently at D.
   */
  static byte patternByte(int layer, long offsetBytes) {
    long x = (offsetBytes + 1) * 0x9E3779B97F4A7C15L + (layer + 1) * 0xC2B2AE3D27D4EB4FL;
    return (byte) ((x >>> 56) ^ (x >>> 29));
  }

  /** Whether every byte of every peer layer is still zero. */
  boolean peerUntouched() {
    for (MemoryRegion r : peerLayers) {
      ByteBuffer b = r.buffer(0, (int) r.lengthBytes());
      for (int i = 0; i < b.capacity(); i++) {
        if (b.get(i) != 0) {
          return false;
        }
      }
    }
    return true;
  }

  ConnectorWorker worker(Role role, TransferMode mode, String engineId, ConnectorSettings s) {
    return worker(role, mode, engineId, s, transport, localLayers);
  }

  /** A worker of the given identity (a TP rank other than 0 of 1, say). */
  ConnectorWorker worker(EngineIdentity identity, ConnectorSettings s) {
    ConnectorWorker w = new ConnectorWorker(kit.system(), identity, transport, s);
    w.registerKvCaches(GEOMETRY, localLayers);
    workers.add(w);
    return w;
  }

  /** A worker with its own transport over the given layers (the peer's, for a second worker). */
  ConnectorWorker worker(Role role, TransferMode mode, String engineId, ConnectorSettings s,
      Transport t, List<MemoryRegion> layers) {
    ConnectorWorker w =
        new ConnectorWorker(
            kit.system(), new EngineIdentity(role, engineId, 0, 1, 0, 1, mode), t, s);
    w.registerKvCaches(GEOMETRY, layers);
    workers.add(w);
    return w;
  }

  /** The peer's real handshake answer: its registered layers described by the transport. */
  byte[] peerMetadata(EngineIdentity peer) {
    return peerMetadata(peer, GEOMETRY);
  }

  /**
   * The handshake answer of a peer worker holding {@code 1 / tpSize} of {@link #GEOMETRY}'s KV
   * heads (one rank's cache of a wider TP), over the peer's layers.
   */
  byte[] peerMetadataOfRank(EngineIdentity peer) {
    KvCacheGeometry g = GEOMETRY;
    return peerMetadata(peer, KvCacheGeometry.standard(
        g.numBlocks(), g.blockSize(), g.kvHeads() / peer.tpSize(), g.headDim(), g.elementBytes()));
  }

  private byte[] peerMetadata(EngineIdentity peer, KvCacheGeometry geometry) {
    List<RegionDescriptor> descriptors = new ArrayList<>();
    for (MemoryRegion r : peerLayers) {
      descriptors.add(transport.describe(r));
    }
    return new AgentMetadata(peer.engineId(), peer.dpRank(), peer.tpRank(), peer.tpSize(),
        transport.name(), geometry, descriptors).pack();
  }

  /**
   * Starts the hand-played peer.
   *
   * @param metadata what it answers to GetMetadata; null: it never answers
   */
  ActorRef<EngineActor.Command> startPeer(EngineIdentity peer, Function<EngineIdentity, byte[]> metadata) {
    return kit.spawn(peerBehavior(peer, metadata), peer.toActorName());
  }

  /**
   * Starts another incarnation of the hand-played peer under {@code parent} (its name is the
   * engine's, so it is listed beside one still running under the test kit's guardian, as an
   * engine attaching again is in a cluster before the old worker's entry is gone).
   */
  ActorRef<EngineActor.Command> startPeerUnder(String parent, EngineIdentity peer,
      Function<EngineIdentity, byte[]> metadata) {
    TestProbe<ActorRef<EngineActor.Command>> started = kit.createTestProbe();
    kit.spawn(Behaviors.<Void>setup(ctx -> {
      started.ref().tell(ctx.spawn(peerBehavior(peer, metadata), peer.toActorName()));
      return Behaviors.empty();
    }), parent);
    return started.receiveMessage(Duration.ofSeconds(10));
  }

  private Behavior<EngineActor.Command> peerBehavior(EngineIdentity peer,
      Function<EngineIdentity, byte[]> metadata) {
    ActorRef<EngineActor.Command> inbox = peerInbox.ref();
    return
        Behaviors.setup(
            ctx -> {
              ctx.getSystem()
                  .receptionist()
                  .tell(Receptionist.register(EngineActor.serviceKey(peer.role()), ctx.getSelf()));
              return Behaviors.receive(EngineActor.Command.class)
                  .onMessage(
                      PeerProtocol.GetMetadata.class,
                      m -> {
                        byte[] blob = metadata == null ? null : metadata.apply(peer);
                        if (blob != null) {
                          m.replyTo()
                              .tell(new PeerProtocol.MetadataReply(peer.engineId(), peer.tpRank(), blob));
                        }
                        return Behaviors.same();
                      })
                  .onAnyMessage(
                      m -> {
                        inbox.tell(m);
                        return Behaviors.same();
                      })
                  .build();
            });
  }

  /** Hand-played P workers of "prefill-0" at TP 2 (WRITE), both listed. */
  void twoPrefillWorkersListed() {
    twoPrefillWorkersListed(TransferMode.WRITE);
  }

  /** Hand-played P workers of "prefill-0" at TP 2 in {@code mode}, both listed. */
  void twoPrefillWorkersListed(TransferMode mode) {
    for (int rank = 0; rank < 2; rank++) {
      startPeer(new EngineIdentity(Role.PREFILL, "prefill-0", 0, 1, rank, 2, mode),
          this::peerMetadataOfRank);
    }
    awaitListed(Role.PREFILL, "prefill-0", 2);
  }

  /** Waits until {@code engineId} is listed in the local Receptionist. */
  void awaitListed(Role role, String engineId) {
    awaitListed(role, engineId, 1);
  }

  /** Waits until the receptionist lists at least {@code workers} workers of {@code engineId}. */
  void awaitListed(Role role, String engineId, int workers) {
    awaitWorkersListed(role, engineId, listed -> assertTrue(listed >= workers,
        engineId + ": " + listed + " of " + workers + " listed yet"));
  }

  /** Waits until the receptionist lists no worker of {@code engineId}. */
  void awaitUnlisted(Role role, String engineId) {
    awaitWorkersListed(role, engineId, listed -> assertEquals(0L, listed, engineId + " still listed"));
  }

  /** Asks the receptionist until {@code check} passes for the count of {@code engineId}'s workers. */
  private void awaitWorkersListed(Role role, String engineId,
      java.util.function.LongConsumer check) {
    TestProbe<Receptionist.Listing> probe = kit.createTestProbe();
    String name = java.net.URLEncoder.encode(engineId, java.nio.charset.StandardCharsets.UTF_8);
    probe.awaitAssert(
        Duration.ofSeconds(10),
        () -> {
          kit.system().receptionist().tell(Receptionist.find(EngineActor.serviceKey(role), probe.ref()));
          Receptionist.Listing l = probe.receiveMessage();
          check.accept(l.getAllServiceInstances(EngineActor.serviceKey(role)).stream()
              .filter(r -> r.path().name().endsWith(name))
              .count());
          return null;
        });
  }

  /** P, WRITE: the worker computes every layer of {@code request} and fires its events. */
  static void saveAllLayers(ConnectorWorker p, ReqMeta request) {
    ConnectorMetadata meta = new ConnectorMetadata(List.of(request), List.of(), List.of());
    for (int l = 0; l < LAYERS; l++) {
      HostLayerEvent e = new HostLayerEvent();
      p.saveKvLayer(meta, l, e);
      e.fire();
    }
    p.waitForSave();
  }

  /** What a worker reported finished, collected until {@code done} holds (or 10 s pass). */
  Finished awaitFinished(ConnectorWorker w, java.util.function.Predicate<Finished> done) {
    Set<String> sending = new HashSet<>();
    Set<String> receiving = new HashSet<>();
    Map<String, String> failed = new HashMap<>();
    Set<Integer> loadErrors = new HashSet<>();
    Finished[] all = new Finished[1];
    kit.createTestProbe()
        .awaitAssert(
            Duration.ofSeconds(10),
            Duration.ofMillis(10),
            () -> {
              Finished f = w.getFinished();
              sending.addAll(f.doneSending());
              receiving.addAll(f.doneReceiving());
              failed.putAll(f.failed());
              loadErrors.addAll(f.blockIdsWithLoadErrors());
              all[0] = new Finished(Set.copyOf(sending), Set.copyOf(receiving), Map.copyOf(failed),
                  Set.copyOf(loadErrors));
              assertTrue(done.test(all[0]), "finished so far on " + w.identity().label() + ": " + all[0]);
              return null;
            });
    return all[0];
  }

  @Override
  public void close() {
    workers.forEach(ConnectorWorker::shutdown);
    kit.shutdownTestKit();
    localRegistry.close();
    peerRegistry.close();
  }
}
