package dev.kvferry.bench;

import java.io.FileWriter;
import java.io.IOException;
import java.io.PrintWriter;
import java.io.UncheckedIOException;
import java.util.function.IntFunction;

/**
 * A suite's raw samples, each with the {@link System#nanoTime} it happened at, appended as CSV to
 * the file a system property names, so a tail can be laid against when it happened (bursts, other
 * processes' activity, a scheduler trace). Nothing is written when the property is not set.
 */
final class SamplesFile {
  private SamplesFile() {}

  /**
   * With {@code -D<property>=F}: appends {@code header}, then one line per sample: {@code at[i]}
   * and {@code values.apply(i)} (already comma-separated).
   */
  static void appendIfAsked(String property, String header, long[] at, IntFunction<String> values) {
    String file = System.getProperty(property);
    if (file == null) {
      return;
    }
    try (PrintWriter w = new PrintWriter(new FileWriter(file, true))) {
      w.println(header);
      for (int i = 0; i < at.length; i++) {
        w.println(at[i] + "," + values.apply(i));
      }
    } catch (IOException e) {
      throw new UncheckedIOException("samples not written to " + file, e);
    }
  }
}
