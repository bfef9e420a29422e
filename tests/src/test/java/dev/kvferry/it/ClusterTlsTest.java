package dev.kvferry.it;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.typesafe.config.Config;
import com.typesafe.config.ConfigFactory;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.TimeUnit;
import org.apache.pekko.actor.Address;
import org.apache.pekko.actor.testkit.typed.javadsl.ActorTestKit;
import org.apache.pekko.actor.typed.ActorSystem;
import org.apache.pekko.actor.typed.javadsl.Behaviors;
import org.apache.pekko.cluster.Member;
import org.apache.pekko.cluster.MemberStatus;
import org.apache.pekko.cluster.typed.Cluster;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * Cluster traffic over TLS with mutual authentication, configured by kvferry-tls.conf exactly as
 * docs/security.md tells an operator to: a CA made with the JDK's keytool, a key store per node
 * signed by it, a trust store holding only the CA. A node with a signed certificate joins; a node
 * whose certificate the CA did not sign is refused even though it trusts the cluster's CA (so only
 * the servers' check of the client certificate can stop it).
 */
class ClusterTlsTest {

  private static final String PASSWORD = "kvferry-test";
  private static final Duration JOIN_WITHIN = Duration.ofSeconds(60);

  @TempDir Path dir;
  private final List<ActorSystem<?>> systems = new ArrayList<>();

  @AfterEach
  void stop() {
    systems.forEach(ActorSystem::terminate);
    for (ActorSystem<?> s : systems) {
      s.getWhenTerminated().toCompletableFuture().orTimeout(30, TimeUnit.SECONDS).exceptionally(e -> null).join();
    }
  }

  private void keytool(String... args) throws Exception {
    Path keytool = Path.of(ProcessHandle.current().info().command().orElseThrow()).resolveSibling("keytool");
    List<String> cmd = new ArrayList<>(List.of(keytool.toString()));
    cmd.addAll(List.of(args));
    Process p = new ProcessBuilder(cmd).directory(dir.toFile()).redirectErrorStream(true).start();
    String out = new String(p.getInputStream().readAllBytes());
    assertEquals(0, p.waitFor(), "keytool " + String.join(" ", args) + ":\n" + out);
  }

  /**
   * The keytool commands of docs/security.md: a CA, a trust store holding it, and one member key
   * store it signs (both members use it: two would only double keytool's start-up time). The
   * outsider's self-signed store is made alongside.
   */
  private void makeStores() throws Exception {
    var outsider = java.util.concurrent.CompletableFuture.runAsync(() -> {
      try {
        keytool("-genkeypair", "-alias", "node", "-keyalg", "EC", "-groupname", "secp256r1",
            "-dname", "CN=outsider", "-validity", "2", "-keystore", "outsider.p12", "-storetype",
            "PKCS12", "-storepass", PASSWORD);
      } catch (Exception e) {
        throw new IllegalStateException(e);
      }
    });
    keytool("-genkeypair", "-alias", "kvferry-ca", "-keyalg", "EC", "-groupname", "secp256r1",
        "-dname", "CN=kvferry-ca", "-ext", "bc:c", "-validity", "2", "-keystore", "ca.p12",
        "-storetype", "PKCS12", "-storepass", PASSWORD);
    keytool("-exportcert", "-alias", "kvferry-ca", "-keystore", "ca.p12", "-storepass", PASSWORD,
        "-rfc", "-file", "ca.pem");
    keytool("-importcert", "-noprompt", "-alias", "kvferry-ca", "-file", "ca.pem", "-keystore",
        "truststore.p12", "-storetype", "PKCS12", "-storepass", PASSWORD);
    keytool("-genkeypair", "-alias", "node", "-keyalg", "EC", "-groupname", "secp256r1",
        "-dname", "CN=member", "-validity", "2", "-keystore", "member.p12", "-storetype",
        "PKCS12", "-storepass", PASSWORD);
    keytool("-certreq", "-alias", "node", "-keystore", "member.p12", "-storepass", PASSWORD,
        "-file", "member.csr");
    keytool("-gencert", "-alias", "kvferry-ca", "-keystore", "ca.p12", "-storepass", PASSWORD,
        "-infile", "member.csr", "-outfile", "member.pem", "-rfc", "-validity", "2",
        "-ext", "ku:c=digitalSignature,keyEncipherment", "-ext", "eku=serverAuth,clientAuth");
    keytool("-importcert", "-noprompt", "-alias", "kvferry-ca", "-file", "ca.pem", "-keystore",
        "member.p12", "-storepass", PASSWORD);
    keytool("-importcert", "-alias", "node", "-file", "member.pem", "-keystore", "member.p12",
        "-storepass", PASSWORD);
    outsider.join();
  }

  /** A cluster member with kvferry-tls.conf as its application config, as -Dconfig.resource gives. */
  private ActorSystem<Void> member(String keyStore, int port, int seedPort) {
    Config config = ConfigFactory.parseMap(Map.of(
            "kvferry.tls.key-store", dir.resolve(keyStore).toString(),
            "kvferry.tls.key-store-password", PASSWORD,
            "kvferry.tls.trust-store", dir.resolve("truststore.p12").toString(),
            "kvferry.tls.trust-store-password", PASSWORD,
            "pekko.remote.artery.canonical.port", port,
            "pekko.cluster.seed-nodes", List.of("pekko://kvferry@127.0.0.1:" + seedPort),
            "pekko.cluster.roles", List.of("client"),
            "pekko.coordinated-shutdown.exit-jvm", "off",
            "pekko.cluster.retry-unsuccessful-join-after", "2s",
            "pekko.loglevel", "ERROR"))
        .withFallback(ConfigFactory.parseResources("kvferry-tls.conf"))
        .withFallback(ConfigFactory.parseResources("kvferry-pekko.conf"))
        .withFallback(ConfigFactory.defaultReference())
        .resolve();
    assertEquals("tls-tcp", config.getString("pekko.remote.artery.transport"));
    ActorSystem<Void> s = ActorSystem.create(Behaviors.empty(), "kvferry", config);
    systems.add(s);
    return s;
  }

  private static boolean isUp(ActorSystem<?> seen, Address member) {
    for (Member m : Cluster.get(seen).state().getMembers()) {
      if (m.address().equals(member) && m.status() == MemberStatus.up()) {
        return true;
      }
    }
    return false;
  }

  @Test
  void aNodeSignedByTheClusterCaJoinsAndANodeWithAnotherCertificateIsRefused() throws Exception {
    makeStores();
    int seedPort = dev.kvferry.node.FreePorts.next();
    ActorSystem<Void> a = member("member.p12", seedPort, seedPort);
    ActorTestKit kit = ActorTestKit.create(a);
    Address aAddress = Cluster.get(a).selfMember().address();
    kit.createTestProbe().awaitAssert(JOIN_WITHIN, Duration.ofMillis(100), () -> {
      assertTrue(isUp(a, aAddress), "node-a formed the cluster");
      return null;
    });
    ActorSystem<Void> outsider = member("outsider.p12", dev.kvferry.node.FreePorts.next(), seedPort);
    ActorSystem<Void> b = member("member.p12", dev.kvferry.node.FreePorts.next(), seedPort);
    Address bAddress = Cluster.get(b).selfMember().address();
    Address outsiderAddress = Cluster.get(outsider).selfMember().address();

    kit.createTestProbe().awaitAssert(JOIN_WITHIN, Duration.ofMillis(200), () -> {
      assertTrue(isUp(a, bAddress), "node-b (signed by the CA) is up in node-a's view");
      assertTrue(isUp(b, bAddress), "node-b sees itself up");
      return null;
    });
    // The outsider has been knocking since before node-b started (each attempt ends in a TLS
    // bad_certificate alert from node-a); give it a few more seconds to get in, which it must not.
    kit.createTestProbe().expectNoMessage(Duration.ofSeconds(5));
    for (Member m : Cluster.get(a).state().getMembers()) {
      assertFalse(m.address().equals(outsiderAddress), "the outsider became a member: " + m);
    }
    assertFalse(isUp(outsider, outsiderAddress), "the outsider thinks it joined");
    assertEquals(2, Cluster.get(a).state().members().size(), "members: node-a and node-b");
  }
}
