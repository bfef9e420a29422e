package dev.kvferry.rdma.cuda;

import com.sun.jna.Memory;
import com.sun.jna.Pointer;

/**
 * The {@code void** kernelParams} of cuLaunchKernel, allocated once and refilled per launch: slot
 * {@code i} holds parameter {@code i}'s value (8 bytes, read as 4 for an int parameter) and
 * {@link #pointer()} is the array of pointers to the slots. The driver copies the values at launch,
 * so the same instance serves the next launch at once. Not thread-safe.
 */
public final class KernelArgs {
  private final Memory values;
  private final Memory pointers;

  public KernelArgs(int count) {
    values = new Memory(8L * count);
    pointers = new Memory(8L * count);
    for (int i = 0; i < count; i++) {
      pointers.setLong(8L * i, Pointer.nativeValue(values) + 8L * i);
    }
  }

  /** A pointer or 64-bit integer parameter. */
  public KernelArgs set(int index, long value) {
    values.setLong(8L * index, value);
    return this;
  }

  /** A 32-bit integer parameter. */
  public KernelArgs setInt(int index, int value) {
    values.setInt(8L * index, value);
    return this;
  }

  public long pointer() {
    return Pointer.nativeValue(pointers);
  }
}
