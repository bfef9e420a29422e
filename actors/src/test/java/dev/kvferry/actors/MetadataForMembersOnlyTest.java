package dev.kvferry.actors;

import static org.junit.jupiter.api.Assertions.assertEquals;

import com.typesafe.config.Config;
import com.typesafe.config.ConfigFactory;
import dev.kvferry.actors.connector.ConnectorWorker;
import dev.kvferry.actors.connector.Role;
import dev.kvferry.actors.connector.TransferMode;
import dev.kvferry.actors.engine.ConnectorSettings;
import dev.kvferry.actors.engine.EngineIdentity;
import dev.kvferry.actors.plan.KvCacheGeometry;
import dev.kvferry.rdma.MemoryRegion;
import dev.kvferry.rdma.RegionRegistry;
import dev.kvferry.rdma.TransportOptions;
import dev.kvferry.rdma.Transports;
import java.time.Duration;
import java.util.List;
import org.apache.pekko.actor.testkit.typed.javadsl.ActorTestKit;
import org.apache.pekko.actor.testkit.typed.javadsl.TestProbe;
import org.apache.pekko.actor.typed.ActorRef;
import org.apache.pekko.actor.typed.ActorRefResolver;
import org.apache.pekko.cluster.MemberStatus;
import org.apache.pekko.cluster.typed.Cluster;
import org.apache.pekko.cluster.typed.Join;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;

/**
 * Artery delivers messages from any actor system that can reach a node's port, joined or not. A
 * worker's metadata (CMA pid and addresses, CUDA IPC handles, tcp tokens) must go to cluster
 * members only: a system that knows the engine's path but never joined gets no answer; the same
 * system, once a member, does.
 */
class MetadataForMembersOnlyTest {

  private final ActorTestKit member = ActorTestKit.create("kvferry", config());
  private final ActorTestKit outsider = ActorTestKit.create("kvferry", config());
  private RegionRegistry registry;
  private ConnectorWorker worker;

  private static Config config() {
    return ConfigFactory.parseString(String.join("\n",
            "pekko.actor.provider = cluster",
            "pekko.remote.artery.canonical.hostname = 127.0.0.1",
            "pekko.remote.artery.canonical.port = 0",
            "pekko.cluster.jmx.multi-mbeans-in-same-jvm = on",
            "pekko.loglevel = WARNING"))
        .withFallback(ConfigFactory.load());
  }

  @AfterEach
  void stop() {
    if (worker != null) {
      worker.close();
    }
    if (registry != null) {
      registry.close();
    }
    outsider.shutdownTestKit();
    member.shutdownTestKit();
  }

  @Test
  void metadataIsServedToMembersOnly() throws Exception {
    Cluster self = Cluster.get(member.system());
    self.manager().tell(Join.create(self.selfMember().address()));
    member.createTestProbe().awaitAssert(Duration.ofSeconds(20), () -> {
      assertEquals(MemberStatus.up(), self.selfMember().status());
      return null;
    });
    KvCacheGeometry g = KvCacheGeometry.standard(8, 16, 2, 16, 2);
    registry = new RegionRegistry("decode-0");
    MemoryRegion layer = registry.allocateHost(g.layerRegionBytes());
    worker = new ConnectorWorker(member.system(),
        new EngineIdentity(Role.DECODE, "decode-0", 0, 1, 0, 1, TransferMode.WRITE),
        Transports.open("cma", registry, TransportOptions.defaults()), ConnectorSettings.DEFAULTS);
    worker.registerKvCaches(g, List.of(layer));

    // The outsider learns the engine's full path (as an attacker scanning for it could).
    String path = ActorRefResolver.get(member.system()).toSerializationFormat(worker.engineRef());
    ActorRef<EngineActor.Command> engine =
        ActorRefResolver.get(outsider.system()).resolveActorRef(path);
    TestProbe<PeerProtocol.MetadataReply> probe = outsider.createTestProbe();

    engine.tell(new PeerProtocol.GetMetadata(probe.ref()));
    probe.expectNoMessage(Duration.ofSeconds(3));

    Cluster joined = Cluster.get(outsider.system());
    joined.manager().tell(Join.create(self.selfMember().address()));
    outsider.createTestProbe().awaitAssert(Duration.ofSeconds(20), () -> {
      assertEquals(MemberStatus.up(), joined.selfMember().status());
      return null;
    });
    member.createTestProbe().awaitAssert(Duration.ofSeconds(20), () -> {
      assertEquals(2, self.state().members().size());
      return null;
    });
    engine.tell(new PeerProtocol.GetMetadata(probe.ref()));
    PeerProtocol.MetadataReply reply =
        probe.expectMessageClass(PeerProtocol.MetadataReply.class, Duration.ofSeconds(10));
    assertEquals("decode-0", reply.engineId());
  }
}
