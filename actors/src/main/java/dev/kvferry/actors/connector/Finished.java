package dev.kvferry.actors.connector;

import java.util.Map;
import java.util.Set;

/**
 * Answer of {@code getFinished}: requests whose transfers ended since the last call.
 *
 * @param doneSending the engine may free these requests' blocks now: only requests whose free the
 *     connector delayed ({@code requestFinished} said so)
 * @param doneReceiving D: these requests' KV is in place; decoding may start
 * @param failed either side: transfers that failed, with the reason; the engine frees their blocks
 *     (and on D fails or recomputes the request)
 * @param blockIdsWithLoadErrors D: blocks of failed loads, reported no later than the request
 *     itself (vLLM's {@code get_block_ids_with_load_errors}); the engine recomputes them
 */
public record Finished(
    Set<String> doneSending,
    Set<String> doneReceiving,
    Map<String, String> failed,
    Set<Integer> blockIdsWithLoadErrors) {

  public static final Finished NONE = new Finished(Set.of(), Set.of(), Map.of(), Set.of());

  public Finished {
    blockIdsWithLoadErrors = blockIdsWithLoadErrors == null ? Set.of() : blockIdsWithLoadErrors;
  }

  public Finished(Set<String> doneSending, Set<String> doneReceiving, Map<String, String> failed) {
    this(doneSending, doneReceiving, failed, Set.of());
  }

  public boolean isEmpty() {
    return doneSending.isEmpty() && doneReceiving.isEmpty() && failed.isEmpty()
        && blockIdsWithLoadErrors.isEmpty();
  }
}
