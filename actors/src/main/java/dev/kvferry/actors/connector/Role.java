package dev.kvferry.actors.connector;

/** Which side of the disaggregated deployment an engine is. */
public enum Role {
  /** Computes the prompt's KV cache and sends it (the seed's kv_producer). */
  PREFILL,
  /** Receives the KV cache and generates tokens (the seed's kv_consumer). */
  DECODE;

  /** The lower-case name used as cluster role and in config: {@code prefill} or {@code decode}. */
  public String clusterRole() {
    return name().toLowerCase(java.util.Locale.ROOT);
  }

  public Role opposite() {
    return this == PREFILL ? DECODE : PREFILL;
  }

  public static Role parse(String s) {
    for (Role r : values()) {
      if (r.clusterRole().equalsIgnoreCase(s)) {
        return r;
      }
    }
    throw new IllegalArgumentException("unknown role '" + s + "': expected prefill or decode");
  }
}
