package dev.kvferry.rdma;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;

/** Who this host is, for deciding whether a peer is reachable through same-host transports. */
public final class HostIdentity {
  private static final String BOOT_ID = readBootId();

  private HostIdentity() {}

  /** The kernel's boot id: equal for two processes exactly when they share a running kernel. */
  public static String bootId() {
    return BOOT_ID;
  }

  private static String readBootId() {
    try {
      return Files.readString(Path.of("/proc/sys/kernel/random/boot_id"), StandardCharsets.US_ASCII)
          .trim();
    } catch (IOException | RuntimeException e) {
      return "";
    }
  }
}
