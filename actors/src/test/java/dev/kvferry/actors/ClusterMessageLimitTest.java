package dev.kvferry.actors;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.typesafe.config.ConfigFactory;
import java.util.Optional;
import java.util.stream.IntStream;
import org.apache.pekko.actor.testkit.typed.javadsl.ActorTestKit;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

class ClusterMessageLimitTest {
  private static ActorTestKit kit;

  @BeforeAll
  static void start() {
    kit = ActorTestKit.create(ConfigFactory.parseString(
            "pekko.remote.artery.advanced.maximum-frame-size = 64000")
        .withFallback(ConfigFactory.load()));
  }

  @AfterAll
  static void stop() {
    kit.shutdownTestKit();
  }

  @Test
  void blockListsThatFitPassWithoutBeingSerialized() {
    ClusterMessageLimit limit = ClusterMessageLimit.of(kit.system());
    assertEquals(Optional.empty(), limit.whyNotSendable(blocks(10_000), 10_000, () -> "list"));
  }

  @Test
  void measuresListsPastTheCheapBoundAndRefusesOnlyThoseThatDoNotFit() {
    ClusterMessageLimit limit = ClusterMessageLimit.of(kit.system());
    // 15,000 small ids: over the 5-bytes-per-int bound, under the frame once serialized.
    assertEquals(Optional.empty(), limit.whyNotSendable(blocks(15_000), 15_000, () -> "list"));
    Optional<String> why = limit.whyNotSendable(blocks(40_000), 40_000, () -> "the list of 40000 ids");
    assertTrue(why.isPresent());
    assertTrue(why.get().startsWith("the list of 40000 ids is "), why.get());
    assertTrue(why.get().contains("pekko.remote.artery.advanced.maximum-frame-size"), why.get());
    assertTrue(why.get().contains("(it is 64000 bytes)"), why.get());
  }

  private static PeerProtocol.RemoteBlocks blocks(int n) {
    return new PeerProtocol.RemoteBlocks("tx", "req", IntStream.range(0, n).toArray(), "d", 0, 0);
  }
}
