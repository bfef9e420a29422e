package dev.kvferry.actors.connector;

/**
 * Answer of {@code numNewMatchedTokens}: how many tokens the remote side will provide beyond those
 * already computed, and whether they arrive asynchronously (between scheduler steps).
 */
public record MatchedTokens(int count, boolean async) {
  public static final MatchedTokens NONE = new MatchedTokens(0, false);
}
