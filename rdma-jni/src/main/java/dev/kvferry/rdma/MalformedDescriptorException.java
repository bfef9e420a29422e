package dev.kvferry.rdma;

/** A peer sent bytes that are not a valid region descriptor. */
public final class MalformedDescriptorException extends Exception {
  private static final long serialVersionUID = 1L;

  public MalformedDescriptorException(String message) {
    super(message);
  }
}
