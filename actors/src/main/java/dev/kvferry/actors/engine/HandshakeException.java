package dev.kvferry.actors.engine;

/** A handshake with a remote engine failed: unreachable, garbage metadata, or incompatible KV. */
public final class HandshakeException extends Exception {
  private static final long serialVersionUID = 1L;

  public HandshakeException(String message) {
    super(message);
  }
}
