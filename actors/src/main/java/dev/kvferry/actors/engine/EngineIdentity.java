package dev.kvferry.actors.engine;

import dev.kvferry.actors.connector.Role;
import dev.kvferry.actors.connector.TransferMode;
import java.net.URLDecoder;
import java.net.URLEncoder;
import java.nio.charset.StandardCharsets;
import java.util.Optional;

/**
 * Who one engine worker is: its role, the engine (one per DP rank) it belongs to, and its place in
 * the DP and TP groups. It travels inside the Receptionist registration as the actor's name, so a
 * listing alone tells a subscriber everything it routes on, with no extra round trip.
 */
public record EngineIdentity(
    Role role, String engineId, int dpRank, int dpSize, int tpRank, int tpSize, TransferMode mode) {

  private static final String PREFIX = "engine";

  public EngineIdentity {
    if (engineId == null || engineId.isBlank()) {
      throw new IllegalArgumentException("engine id must not be empty");
    }
    if (dpSize < 1 || dpRank < 0 || dpRank >= dpSize) {
      throw new IllegalArgumentException(
          "engine " + engineId + ": DP rank " + dpRank + " outside DP size " + dpSize);
    }
    if (tpSize < 1 || tpRank < 0 || tpRank >= tpSize) {
      throw new IllegalArgumentException(
          "engine " + engineId + ": TP rank " + tpRank + " outside TP size " + tpSize);
    }
  }

  /** The actor name this worker registers under; {@link #fromActorName} reads it back. */
  public String toActorName() {
    return String.join(
        "~",
        PREFIX,
        role.clusterRole(),
        Integer.toString(dpRank),
        Integer.toString(dpSize),
        Integer.toString(tpRank),
        Integer.toString(tpSize),
        mode.configName(),
        URLEncoder.encode(engineId, StandardCharsets.UTF_8));
  }

  /**
   * Parses an actor name written by {@link #toActorName}, possibly behind a prefix ending in "~"
   * (other actors of the same worker, such as its simulated engine); empty for any other name.
   */
  public static Optional<EngineIdentity> fromActorName(String name) {
    int start = name.indexOf(PREFIX + "~");
    if (start < 0) {
      return Optional.empty();
    }
    String[] p = name.substring(start).split("~");
    if (p.length != 8 || !PREFIX.equals(p[0])) {
      return Optional.empty();
    }
    try {
      return Optional.of(
          new EngineIdentity(
              Role.parse(p[1]),
              URLDecoder.decode(p[7], StandardCharsets.UTF_8),
              Integer.parseInt(p[2]),
              Integer.parseInt(p[3]),
              Integer.parseInt(p[4]),
              Integer.parseInt(p[5]),
              TransferMode.parse(p[6])));
    } catch (IllegalArgumentException e) {
      return Optional.empty();
    }
  }

  /** "prefill-0/tp1" style label for logs and errors. */
  public String label() {
    return engineId + "/tp" + tpRank;
  }
}
