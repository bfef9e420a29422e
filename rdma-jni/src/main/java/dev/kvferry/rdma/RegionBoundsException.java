package dev.kvferry.rdma;

/** A transfer would touch bytes outside a registered region; nothing was moved. */
public final class RegionBoundsException extends IllegalArgumentException {
  public RegionBoundsException(String message) {
    super(message);
  }
}
