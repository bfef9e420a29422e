package dev.kvferry.actors;

import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvferry.actors.connector.ConnectorWorker;
import dev.kvferry.actors.connector.Role;
import dev.kvferry.actors.connector.TransferMode;
import dev.kvferry.actors.engine.ConnectorSettings;
import java.time.Duration;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import org.apache.pekko.actor.testkit.typed.javadsl.TestProbe;
import org.apache.pekko.actor.typed.ActorRef;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;

/** Stopping a worker: what a node waits for before it closes the worker's transport. */
class WorkerStopTest {

  private final PeerFixture fx = new PeerFixture();

  @AfterEach
  void stop() {
    fx.close();
  }

  @Test
  void stopCompletesOnlyOnceTheWorkersActorHasTerminated() throws Exception {
    ConnectorWorker w =
        fx.worker(Role.DECODE, TransferMode.WRITE, "decode-0", ConnectorSettings.DEFAULTS);
    ActorRef<EngineActor.Command> ref = w.engineRef();
    TestProbe<Object> watcher = fx.kit.createTestProbe();
    CompletableFuture<Void> stopped = w.stop();
    stopped.get(10, TimeUnit.SECONDS);
    // Terminated already when the future completed: the transport may be closed now.
    watcher.expectTerminated(ref, Duration.ofMillis(100));
    assertTrue(w.stop().isDone(), "stopping twice waits for nothing");
  }
}
