package dev.kvferry.management;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.typesafe.config.ConfigFactory;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.util.Base64;
import org.apache.pekko.actor.testkit.typed.javadsl.ActorTestKit;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;

/** kvferry.management.basic-auth: with a user set, every management route asks for it. */
class ManagementBasicAuthTest {

  private ActorTestKit kit;
  private final HttpClient http = HttpClient.newHttpClient();

  @AfterEach
  void stop() {
    if (kit != null) {
      kit.shutdownTestKit();
    }
  }

  private int get(URI uri, String credentials) throws Exception {
    HttpRequest.Builder b = HttpRequest.newBuilder(uri);
    if (credentials != null) {
      b.header("Authorization", "Basic "
          + Base64.getEncoder().encodeToString(credentials.getBytes(StandardCharsets.UTF_8)));
    }
    return http.send(b.build(), HttpResponse.BodyHandlers.discarding()).statusCode();
  }

  @Test
  void everyRouteAsksForTheConfiguredUserAndPassword() throws Exception {
    kit = ActorTestKit.create("kvferry", ConfigFactory.parseString("""
            kvferry.management.basic-auth { username = "ops", password = "s3cret" }
            """).withFallback(ManagementNode.CONFIG).withFallback(ConfigFactory.load()));
    URI base = ManagementServer.start(kit.system());
    for (String path : new String[] {"cluster/members", "alive", "kvferry/readiness"}) {
      URI uri = base.resolve("/" + path);
      assertEquals(401, get(uri, null), path + " without credentials");
      assertEquals(401, get(uri, "ops:wrong"), path + " with a wrong password");
      assertEquals(401, get(uri, "root:s3cret"), path + " with a wrong user");
      int ok = get(uri, "ops:s3cret");
      assertTrue(ok != 401 && ok != 403, path + " with the right credentials answered " + ok);
    }
  }

  @Test
  void aUserWithoutAPasswordIsRefusedAtStartAndNoUserMeansNoAuth() {
    assertThrows(IllegalArgumentException.class, () -> BasicAuth.fromConfig(ConfigFactory.parseString(
        "kvferry.management.basic-auth { username = ops, password = \"\" }")));
    assertFalse(BasicAuth.fromConfig(ConfigFactory.load()).isPresent(), "off by default");
    assertFalse(new BasicAuth("ops", "s3cret").toString().contains("s3cret"));
  }
}
