package dev.kvferry.sim;

/**
 * Token positions {@code [fromToken, toToken)} of one request whose blocks, in order, are {@code
 * blockIds}: what one pattern fill or check covers.
 */
public record TokenRange(long requestKey, int[] blockIds, int fromToken, int toToken) {

  public int tokens() {
    return toToken - fromToken;
  }
}
