package dev.kvferry.node;

import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.time.Duration;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionStage;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.function.Function;
import org.apache.pekko.actor.testkit.typed.javadsl.ActorTestKit;
import org.apache.pekko.actor.typed.ActorRef;
import org.apache.pekko.actor.typed.Behavior;
import org.apache.pekko.actor.typed.javadsl.AskPattern;
import org.apache.pekko.actor.typed.javadsl.Behaviors;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/** Callbacks on Pekko's futures, made plain, run on the thread that completes them. */
class PekkoFuturesTest {

  private static final String DISPATCHER = "pekko-futures-pekko.actor.default-dispatcher-";
  private static ActorTestKit kit;

  /** Holds an ask until told to answer, so a callback is attached before the answer comes. */
  private sealed interface Gate {}

  private record Ask(ActorRef<String> replyTo) implements Gate {}

  private record Open() implements Gate {}

  private static Behavior<Gate> gate(ActorRef<String> waiting) {
    return Behaviors.receive(Gate.class)
        .onMessage(Ask.class, a -> gate(a.replyTo()))
        .onMessage(Open.class, o -> {
          if (waiting != null) {
            waiting.tell("pong");
          }
          return Behaviors.same();
        })
        .build();
  }

  @BeforeAll
  static void start() {
    kit = ActorTestKit.create("pekko-futures");
  }

  @AfterAll
  static void stop() {
    kit.shutdownTestKit();
  }

  /** The thread a callback attached to {@code wrap(ask)} ran on. */
  private static String callbackThread(
      Function<CompletionStage<String>, CompletionStage<String>> wrap) throws Exception {
    ActorRef<Gate> g = kit.spawn(gate(null));
    CompletionStage<String> asked =
        AskPattern.ask(g, Ask::new, Duration.ofSeconds(10), kit.scheduler());
    CompletableFuture<String> thread = wrap.apply(asked)
        .thenApply(v -> Thread.currentThread().getName()).toCompletableFuture();
    g.tell(new Open());
    return thread.get(10, TimeUnit.SECONDS);
  }

  @Test
  void aPlainAsksCallbackRunsOnTheDispatcherThatAnswered() throws Exception {
    String plain = callbackThread(PekkoFutures::plain);
    assertTrue(plain.startsWith(DISPATCHER), plain);
    // Why it exists: the same callback on Pekko's own future leaves Pekko's threads (for the
    // JDK's common pool, or on one or two cores for a new thread per callback).
    String raw = callbackThread(Function.identity());
    assertFalse(raw.startsWith(DISPATCHER), raw);
  }

  @Test
  void aFailedAskFailsThePlainFutureWithItsCause() {
    ActorRef<Gate> silent = kit.spawn(gate(null));
    CompletionStage<String> timedOut =
        AskPattern.ask(silent, Ask::new, Duration.ofMillis(50), kit.scheduler());
    ExecutionException e = assertThrows(ExecutionException.class,
        () -> PekkoFutures.plain(timedOut).get(10, TimeUnit.SECONDS));
    assertInstanceOf(TimeoutException.class, e.getCause());
  }

  @Test
  void aPlainFutureIsReturnedAsItIs() {
    CompletableFuture<String> f = new CompletableFuture<>();
    assertSame(f, PekkoFutures.plain(f));
  }
}
