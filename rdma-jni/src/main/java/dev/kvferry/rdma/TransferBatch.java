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
