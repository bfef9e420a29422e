package dev.kvferry.management;

import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionStage;
import java.util.function.Supplier;
import org.apache.pekko.actor.ActorSystem;
import org.apache.pekko.actor.typed.javadsl.Adapter;

/**
 * kvferry's readiness check for Pekko Management's {@code /ready}: true only when
 * {@link Readiness#ready()} holds (member Up, transport bound, handshake served). Registered in
 * config under {@code pekko.management.health-checks.readiness-checks}; Pekko Management creates it
 * by reflection with the classic actor system, once, and calls it on every {@code /ready}.
 */
public final class KvferryReadinessCheck implements Supplier<CompletionStage<Boolean>> {

  private final org.apache.pekko.actor.typed.ActorSystem<?> system;
  private volatile String lastExplanation = "";

  public KvferryReadinessCheck(ActorSystem system) {
    this.system = Adapter.toTyped(system);
  }

  @Override
  public CompletionStage<Boolean> get() {
    // Everything it reads is in memory: answer at once, well inside the check timeout.
    Readiness readiness = Readiness.of(system);
    String explanation = readiness.explain();
    // Probes call this every few seconds: log changes only, so the log says when and why.
    if (!explanation.equals(lastExplanation)) {
      lastExplanation = explanation;
      system.log().info("kvferry readiness: {}", explanation);
    }
    return CompletableFuture.completedFuture(readiness.ready());
  }
}
