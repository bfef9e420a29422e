package dev.kvferry.bench;

import java.util.Arrays;
import java.util.List;

/** Order statistics of measured samples. */
public final class Samples {
  private Samples() {}

  /** The median; the upper one of the middle pair for an even count (like the peers do). */
  public static double median(double[] values) {
    return percentile(values, 50);
  }

  public static double median(List<Double> values) {
    return median(values.stream().mapToDouble(Double::doubleValue).toArray());
  }

  /** The value at index {@code floor(n * p / 100)} of the sorted samples, as the seed scripts compute it. */
  public static double percentile(double[] values, double p) {
    if (values.length == 0) {
      throw new IllegalArgumentException("no samples");
    }
    double[] sorted = values.clone();
    Arrays.sort(sorted);
    int i = (int) Math.min(sorted.length - 1, Math.floor(sorted.length * p / 100.0));
    return sorted[i];
  }
}
