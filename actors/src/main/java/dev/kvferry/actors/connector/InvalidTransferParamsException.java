package dev.kvferry.actors.connector;

/** kv_transfer_params that cannot be used: a field is missing or has the wrong type or value. */
public final class InvalidTransferParamsException extends Exception {
  private static final long serialVersionUID = 1L;

  public InvalidTransferParamsException(String message) {
    super(message);
  }
}
