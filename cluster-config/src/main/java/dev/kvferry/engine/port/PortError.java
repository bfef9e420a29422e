package dev.kvferry.engine.port;

import java.util.Locale;

/** The error codes of the engine port (docs/engine-port.md); a fatal one closes the connection. */
public enum PortError {
  BAD_FRAME(true),
  UNAUTHORIZED(true),
  BAD_VERSION(true),
  HELLO_REQUIRED(false),
  ALREADY_HELLO(false),
  UNKNOWN_OP(false),
  WRONG_SIDE(false),
  BAD_ARGS(false),
  IDENTITY_MISMATCH(false),
  ENGINE_BUSY(false),
  BAD_MEMORY(false),
  UNKNOWN_REQUEST(false),
  UNKNOWN_METADATA(false),
  WORKERS_MISSING(false),
  NODE_STOPPING(false),
  INTERNAL(false);

  private final boolean fatal;

  PortError(boolean fatal) {
    this.fatal = fatal;
  }

  /** The code as it travels: {@code bad_frame}, ... */
  public String code() {
    return name().toLowerCase(Locale.ROOT);
  }

  public boolean fatal() {
    return fatal;
  }
}
