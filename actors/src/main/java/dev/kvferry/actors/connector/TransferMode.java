package dev.kvferry.actors.connector;

/** Who moves the bytes. */
public enum TransferMode {
  /** P writes each layer into D's blocks as soon as that layer is computed (the seed's default). */
  WRITE,
  /** P keeps its blocks after prefill; D reads every layer, then tells P to release them. */
  READ;

  public String configName() {
    return name().toLowerCase(java.util.Locale.ROOT);
  }

  public static TransferMode parse(String s) {
    for (TransferMode m : values()) {
      if (m.configName().equalsIgnoreCase(s)) {
        return m;
      }
    }
    throw new IllegalArgumentException("unknown transfer mode '" + s + "': expected write or read");
  }
}
