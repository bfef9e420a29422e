package dev.kvferry.rdma;

/** A transfer would touch bytes outside a registered region; nothing was moved. */
public final class RegionBoundsException extends IllegalArgumentException {
  private static final long serialVersionUID = 1L;

  public RegionBoundsException(String message) {
    super(message);
  }
}
