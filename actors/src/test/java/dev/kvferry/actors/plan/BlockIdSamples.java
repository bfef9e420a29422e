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

  /**
   * {@code n} distinct ids below {@code limit}, ascending, cut into runs: after each id a gap of 1
   * to 3 starts with chance 1 in {@code gapOneIn}, while spare ids remain.
   */
  public static int[] runs(Random random, int n, int limit, int gapOneIn) {
    int spare = limit - n;
    int[] ids = new int[n];
    int next = spare == 0 ? 0 : random.nextInt(Math.min(spare, 4) + 1);
    spare -= next;
    for (int i = 0; i < n; i++) {
      if (i > 0 && spare > 0 && random.nextInt(gapOneIn) == 0) {
        int gap = 1 + random.nextInt(Math.min(spare, 3));
        next += gap;
        spare -= gap;
      }
      ids[i] = next++;
    }
    return ids;
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
