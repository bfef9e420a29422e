package dev.kvferry.rdma;

/** A peer sent bytes that are not a valid region descriptor. */
public final class MalformedDescriptorException extends Exception {
  public MalformedDescriptorException(String message) {
    super(message);
  }
}
