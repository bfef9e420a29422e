package dev.kvferry.rdma;

import java.nio.ByteBuffer;

/**
 * Reusable direct-buffer views of one host region for scattering and gathering socket I/O: slot
 * {@code k} is a view whose position and limit are moved to the bytes of the k-th entry of a
 * syscall, so a transfer allocates nothing per block. A region over 2 GiB is covered by windows
 * that start every GiB and reach up to 2 GiB, so any entry of at most 1 GiB fits one window.
 *
 * <p>Not thread-safe: one instance per connection.
 */
final class RegionSlots {
  static final int SLOTS = 64;
  private static final int WINDOW_SHIFT = 30;

  private final MemoryRegion region;
  private final ByteBuffer[][] windows;

  RegionSlots(MemoryRegion region) {
    this.region = region;
    this.windows = new ByteBuffer[(int) ((region.lengthBytes() + (1L << WINDOW_SHIFT) - 1) >>> WINDOW_SHIFT)][];
  }

  MemoryRegion region() {
    return region;
  }

  /**
   * Slot {@code slot} positioned on {@code [offsetBytes, offsetBytes + length)}; the caller has
   * checked the range against the region and {@code length <= 1 GiB}.
   */
  ByteBuffer slot(int slot, long offsetBytes, int length) {
    int w = (int) (offsetBytes >>> WINDOW_SHIFT);
    ByteBuffer[] views = windows[w];
    if (views == null) {
      long start = (long) w << WINDOW_SHIFT;
      ByteBuffer base =
          region.buffer(start, (int) Math.min(region.lengthBytes() - start, Integer.MAX_VALUE));
      views = new ByteBuffer[SLOTS];
      views[0] = base;
      for (int i = 1; i < SLOTS; i++) {
        views[i] = base.duplicate();
      }
      windows[w] = views;
    }
    ByteBuffer view = views[slot];
    int position = (int) (offsetBytes - ((long) w << WINDOW_SHIFT));
    view.limit(position + length);
    view.position(position);
    return view;
  }
}
