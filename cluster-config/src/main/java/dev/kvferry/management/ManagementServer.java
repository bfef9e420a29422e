package dev.kvferry.management;

import java.net.URI;
import java.time.Duration;
import java.util.Optional;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import org.apache.pekko.actor.typed.ActorSystem;
import org.apache.pekko.actor.typed.javadsl.Adapter;
import org.apache.pekko.management.javadsl.PekkoManagement;

/** Starts the Pekko Management HTTP server of a node (cluster, health checks, kvferry routes). */
public final class ManagementServer {

  private static final Duration BIND_TIMEOUT = Duration.ofSeconds(10);

  private ManagementServer() {}

  /**
   * Binds the management server as {@code pekko.management.http} configures it and returns the
   * URI it answers on. Called once by node and router startup; the server stops with the actor
   * system.
   *
   * @throws ManagementStartException if the port cannot be bound (taken, not allowed) in time
   */
  public static URI start(ActorSystem<?> system) throws ManagementStartException {
    PekkoManagement management = PekkoManagement.get(Adapter.toClassic(system));
    String where =
        management.settings().getHttpEffectiveBindHostname()
            + ":"
            + management.settings().getHttpEffectiveBindPort();
    Optional<BasicAuth> auth = BasicAuth.fromConfig(system.settings().config());
    try {
      return URI.create(
          management
              .start(settings -> auth.map(a -> settings.withAuth(a::check)).orElse(settings))
              .toCompletableFuture()
              .get(BIND_TIMEOUT.toMillis(), TimeUnit.MILLISECONDS)
              .toString());
    } catch (ExecutionException e) {
      Throwable cause = e.getCause() != null ? e.getCause() : e;
      throw new ManagementStartException(where, String.valueOf(cause.getMessage()), cause);
    } catch (TimeoutException e) {
      throw new ManagementStartException(
          where, "not bound within " + BIND_TIMEOUT.toSeconds() + " s", e);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw new ManagementStartException(where, "interrupted while binding", e);
    }
  }
}
