package dev.kvferry.management;

import static dev.kvferry.node.PekkoFutures.plain;

import dev.kvferry.actors.EngineActor;
import dev.kvferry.actors.TransferSnapshot;
import dev.kvferry.actors.TransferView;
import dev.kvferry.actors.WriteProgress;
import dev.kvferry.actors.connector.ConnectorWorker;
import dev.kvferry.node.NodeRuntime;
import org.jspecify.annotations.Nullable;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionException;
import java.util.concurrent.TimeoutException;
import org.apache.pekko.actor.typed.ActorSystem;
import org.apache.pekko.actor.typed.javadsl.AskPattern;

/**
 * This node's transfers in flight, merged over its workers, as {@code GET /kvferry/transfers}
 * shows them.
 *
 * @param counts transfers in flight by state ("receiving", "awaiting_release", "writing")
 * @param transfers one line per transfer, oldest first
 * @param unanswered workers that did not answer in time, with the reason; their transfers are
 *     missing from the counts
 */
public record TransfersReport(
    Map<String, Integer> counts, List<TransferLine> transfers, List<String> unanswered) {

  /**
   * One transfer in flight on one worker ({@code engine} is the worker's label, "id/tpN");
   * {@code progress} only for P's writes (state "writing"), else null.
   */
  public record TransferLine(
      String requestId,
      String transferId,
      String state,
      String peerEngineId,
      long ageMs,
      String engine,
      @Nullable WriteProgress progress) {}

  public TransfersReport {
    counts = Map.copyOf(counts);
    transfers = List.copyOf(transfers);
    unanswered = List.copyOf(unanswered);
  }

  /** Asks every registered worker of {@code runtime} for its transfers; never fails. */
  public static CompletableFuture<TransfersReport> collect(NodeRuntime runtime, Duration timeout) {
    ActorSystem<?> system = runtime.system();
    List<CompletableFuture<WorkerAnswer>> asks = new ArrayList<>();
    for (ConnectorWorker worker : runtime.workers()) {
      if (!worker.isRegistered()) {
        continue; // not serving yet: nothing can be in flight
      }
      String label = worker.identity().label();
      asks.add(
          plain(AskPattern.<EngineActor.Command, TransferSnapshot>ask(
                  worker.engineRef(), EngineActor.GetTransfers::new, timeout, system.scheduler()))
              .handle((snapshot, error) -> new WorkerAnswer(label, snapshot, error, timeout)));
    }
    return CompletableFuture.allOf(asks.toArray(CompletableFuture[]::new))
        .thenApply(
            done -> {
              Map<String, Integer> counts = new TreeMap<>();
              List<TransferLine> lines = new ArrayList<>();
              List<String> unanswered = new ArrayList<>();
              for (CompletableFuture<WorkerAnswer> ask : asks) {
                ask.join().addTo(counts, lines, unanswered);
              }
              lines.sort(Comparator.comparingLong(TransferLine::ageMs).reversed());
              return new TransfersReport(counts, lines, unanswered);
            });
  }

  private record WorkerAnswer(
      String engine, @Nullable TransferSnapshot snapshot, @Nullable Throwable error,
      Duration timeout) {

    void addTo(Map<String, Integer> counts, List<TransferLine> lines, List<String> unanswered) {
      if (snapshot == null) {
        unanswered.add(engine + ": " + reason());
        return;
      }
      snapshot.countsByState().forEach((state, n) -> counts.merge(state, n, Integer::sum));
      for (TransferView t : snapshot.transfers()) {
        lines.add(
            new TransferLine(
                t.requestId(), t.transferId(), t.state(), t.peerEngineId(), t.ageMs(), engine,
                t.progress()));
      }
    }

    private String reason() {
      Throwable cause = error instanceof CompletionException && error.getCause() != null
          ? error.getCause()
          : error;
      if (cause instanceof TimeoutException) {
        return "no answer within " + timeout.toMillis() + " ms";
      }
      return String.valueOf(cause);
    }
  }
}
