package dev.kvferry.actors.connector;

import java.util.Map;
import java.util.Set;

/**
 * Answer of {@code getFinished}: requests whose transfers ended since the last call.
 *
 * @param doneSending P: the engine may free these requests' blocks now
 * @param doneReceiving D: these requests' KV is in place; decoding may start
 * @param failed either side: transfers that failed, with the reason; the engine frees their blocks
 *     (and on D fails or recomputes the request)
 */
public record Finished(Set<String> doneSending, Set<String> doneReceiving, Map<String, String> failed) {

  public static final Finished NONE = new Finished(Set.of(), Set.of(), Map.of());

  public boolean isEmpty() {
    return doneSending.isEmpty() && doneReceiving.isEmpty() && failed.isEmpty();
  }
}
