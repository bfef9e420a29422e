package dev.kvferry.demo;

import java.util.List;

/** What one mode's run of the demo workload showed. */
public record ModeReport(
    String mode,
    int requests,
    int completed,
    int aborted,
    int failed,
    long bytes,
    double seconds,
    double gbps,
    double p50Ms,
    double p99Ms,
    int mismatches,
    int leakedBlocks,
    List<String> problems) {

  /**
   * Nothing mismatched, failed or leaked, and at least one request completed: a run in which
   * every request aborted (or none ran) moved and verified nothing, so it shows nothing.
   */
  public boolean passed() {
    return mismatches == 0 && leakedBlocks == 0 && failed == 0 && completed > 0;
  }
}
