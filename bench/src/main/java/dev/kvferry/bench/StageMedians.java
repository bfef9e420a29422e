package dev.kvferry.bench;

import java.util.Arrays;
import java.util.Locale;

/** Per-request stage times (us, NaN where a stage was not passed) summed up as medians. */
public final class StageMedians {
  private StageMedians() {}

  /** "name median, name median, ..." over the requests that passed each stage; "-" for none. */
  public static String describe(String[] names, double[][] perRequest) {
    StringBuilder out = new StringBuilder();
    double[] column = new double[perRequest.length];
    for (int s = 0; s < names.length; s++) {
      int n = 0;
      for (double[] r : perRequest) {
        if (!Double.isNaN(r[s])) {
          column[n++] = r[s];
        }
      }
      out.append(s == 0 ? "" : ", ").append(names[s]).append(' ');
      out.append(n == 0 ? "-" : String.format(Locale.ROOT, "%.0f",
          Samples.median(Arrays.copyOf(column, n))));
    }
    return out.toString();
  }
}
