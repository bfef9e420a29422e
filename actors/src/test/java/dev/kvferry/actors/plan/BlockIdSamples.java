package dev.kvferry.actors.plan;

import java.util.Arrays;
import java.util.Random;

/** Random block id lists for the planner's benchmarks and property tests. */
public final class BlockIdSamples {

  private BlockIdSamples() {}

  /** {@code n} distinct ids below {@code limit}, in random order (a partial Fisher-Yates). */
  public static int[] distinct(Random random, int n, int limit) {
    if (n < 0 || n > limit) {
      throw new IllegalArgumentException(n + " distinct ids below " + limit);
    }
    int[] all = new int[limit];
    for (int i = 0; i < limit; i++) {
      all[i] = i;
    }
    for (int i = 0; i < n; i++) {
      int j = i + random.nextInt(limit - i);
      int t = all[i];
      all[i] = all[j];
      all[j] = t;
    }
    return Arrays.copyOf(all, n);
  }

  /** Shuffles two equally long lists by the same permutation (pairs stay pairs). */
  public static void shuffleTogether(Random random, int[] a, int[] b) {
    for (int i = a.length - 1; i > 0; i--) {
      int j = random.nextInt(i + 1);
      int t = a[i];
      a[i] = a[j];
      a[j] = t;
      t = b[i];
      b[i] = b[j];
      b[j] = t;
    }
  }
}
