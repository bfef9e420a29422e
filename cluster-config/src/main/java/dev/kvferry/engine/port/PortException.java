package dev.kvferry.engine.port;

/** An op failed with one of the port's error codes; the message is for the engine's operator. */
public final class PortException extends Exception {
  private static final long serialVersionUID = 1L;

  private final PortError error;

  public PortException(PortError error, String message) {
    super(message);
    this.error = error;
  }

  public PortError error() {
    return error;
  }

  static PortException badArgs(String message) {
    return new PortException(PortError.BAD_ARGS, message);
  }
}
