package dev.kvferry.actors;

import java.util.List;
import java.util.Map;
import java.util.TreeMap;

/**
 * A worker's transfers in flight, by state, for /kvferry/transfers: its {@link
 * RequestTrackerActor}'s transfers and P's writes in progress (from its {@link WriterActor}).
 */
public record TransferSnapshot(Map<String, Integer> countsByState, List<TransferView> transfers)
    implements LocalOnly {

  /** Counts {@code transfers} by state (sorted by state name). */
  static TransferSnapshot of(List<TransferView> transfers) {
    Map<String, Integer> counts = new TreeMap<>();
    for (TransferView v : transfers) {
      counts.merge(v.state(), 1, Integer::sum);
    }
    return new TransferSnapshot(counts, transfers);
  }
}
