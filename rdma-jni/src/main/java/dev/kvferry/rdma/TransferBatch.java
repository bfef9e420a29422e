package dev.kvferry.rdma;

import java.util.Arrays;
import org.jspecify.annotations.Nullable;

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

  /**
   * Checks every entry against both regions before a byte moves.
   *
   * @throws RegionBoundsException naming the first entry that does not fit
   */
  public void checkWithin(MemoryRegion local, RegionDescriptor remote) {
    for (int i = 0; i < sizes.length; i++) {
      local.checkRange(localOffsets[i], sizes[i]);
      remote.checkRange(remoteOffsets[i], sizes[i]);
    }
  }

  /**
   * For transports that move a batch on a thread of their own: pins {@code local} and checks
   * every entry. Returns null when the batch should go ahead, with {@code local} pinned (the
   * transport unpins it when done); otherwise the status to return at once, with nothing pinned
   * and nothing moved (a closed region, an entry out of bounds, or an empty batch).
   */
  @Nullable TransferStatus pinAndCheck(String transport, MemoryRegion local, RegionDescriptor remote) {
    if (!local.tryPin()) {
      return TransferStatus.failed(transport + ": local region " + local.id() + " is closed");
    }
    try {
      checkWithin(local, remote);
    } catch (RegionBoundsException e) {
      local.unpin();
      return TransferStatus.failed(transport + ": " + e.getMessage() + "; nothing was moved");
    }
    if (totalBytes() == 0) {
      local.unpin();
      return TransferStatus.succeeded(0);
    }
    return null;
  }

  /**
   * This batch cut into at most {@code parts} batches of whole entries, in order, each near an
   * equal share of the bytes; every part has at least one entry. One part: this batch.
   */
  public TransferBatch[] split(int parts) {
    int n = count();
    int want = Math.min(parts, n);
    if (want <= 1) {
      return new TransferBatch[] {this};
    }
    long total = totalBytes();
    TransferBatch[] out = new TransferBatch[want];
    int made = 0;
    int start = 0;
    long sum = 0;
    for (int i = 0; i < n && made < want - 1; i++) {
      sum += sizes[i];
      // Close a part at its share of the bytes, leaving an entry for each part still to come.
      if (sum * want >= total * (made + 1) && n - (i + 1) >= want - made - 1) {
        out[made++] = slice(start, i + 1);
        start = i + 1;
      }
    }
    while (made < want - 1) {
      // Shares ran out before the parts (a few huge entries last): one entry each.
      out[made++] = slice(start, start + 1);
      start++;
    }
    out[made] = slice(start, n);
    return out;
  }

  private TransferBatch slice(int from, int to) {
    return new TransferBatch(Arrays.copyOfRange(localOffsets, from, to),
        Arrays.copyOfRange(remoteOffsets, from, to), Arrays.copyOfRange(sizes, from, to));
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
