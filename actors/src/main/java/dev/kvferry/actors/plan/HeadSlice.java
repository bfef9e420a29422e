package dev.kvferry.actors.plan;

/**
 * The KV heads one copy moves between two ranks: {@code count} heads starting at head {@code
 * localFirst} of the local rank's heads and at head {@code remoteFirst} of the remote rank's.
 * Unused for MLA, whose latent is never split.
 */
public record HeadSlice(int localFirst, int remoteFirst, int count) {

  public HeadSlice {
    if (localFirst < 0 || remoteFirst < 0 || count < 1) {
      throw new IllegalArgumentException(
          "bad head slice: local first " + localFirst + ", remote first " + remoteFirst
              + ", count " + count);
    }
  }

  /** Every head of both sides, which hold the same heads. */
  public static HeadSlice all(int heads) {
    return new HeadSlice(0, 0, heads);
  }
}
