package dev.kvferry.actors.plan;

/**
 * Block ids for a transfer that cannot be planned: lists of different lengths, an id out of range
 * or negative, or an id listed twice. The message names the first offending id and its position.
 *
 * <p>Checked because a peer or a caller causes it, not a bug here: fail that request, keep serving.
 */
public final class InvalidBlockIdsException extends Exception {
  private static final long serialVersionUID = 1L;

  public InvalidBlockIdsException(String message) {
    super(message);
  }
}
