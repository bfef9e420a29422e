package dev.kvferry.rdma;

import java.util.Arrays;

/**
 * One batch of copies between a local and a remote region: entry {@code i} moves {@code
 * sizes[i]} bytes between {@code localOffsets[i]} of the local region and {@code
 * remoteOffsets[i]} of the remote region. Offsets are relative to each region's base.
 *
 * <p>The arrays are owned by the batch once constructed; callers must not mutate them.
 */
public record TransferBatch(long[] localOffsets, long[] remoteOffsets, long[] sizes) {

  public static final TransferBatch EMPTY = new TransferBatch(new long[0], new long[0], new long[0]);

  public TransferBatch {
    if (localOffsets.length != remoteOffsets.length || localOffsets.length != sizes.length) {
      throw new IllegalArgumentException(
          "transfer batch arrays differ in length: local="
              + localOffsets.length
              + " remote="
              + remoteOffsets.length
              + " sizes="
              + sizes.length);
    }
  }

  public int count() {
    return sizes.length;
  }

  public long totalBytes() {
    long total = 0;
    for (long s : sizes) {
      total += s;
    }
    return total;
  }

  @Override
  public boolean equals(Object o) {
    return o instanceof TransferBatch b
        && Arrays.equals(localOffsets, b.localOffsets)
        && Arrays.equals(remoteOffsets, b.remoteOffsets)
        && Arrays.equals(sizes, b.sizes);
  }

  @Override
  public int hashCode() {
    return 31 * (31 * Arrays.hashCode(localOffsets) + Arrays.hashCode(remoteOffsets))
        + Arrays.hashCode(sizes);
  }

  @Override
  public String toString() {
    return "TransferBatch[count=" + count() + ", bytes=" + totalBytes() + "]";
  }
}
