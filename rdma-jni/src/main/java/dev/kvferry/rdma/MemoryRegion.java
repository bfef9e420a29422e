package dev.kvferry.rdma;

import com.sun.jna.Pointer;
import java.nio.ByteBuffer;
import java.util.Objects;
import org.jspecify.annotations.Nullable;

/**
 * A registered range of memory: host memory kvferry allocated itself (page aligned, outside the
 * Java heap) or external memory (a GPU allocation) registered by address. Created only through a
 * {@link RegionRegistry}, which gives it an id and frees it on close.
 */
public final class MemoryRegion implements AutoCloseable {

  private final RegionRegistry registry;
  private final int id;
  private final long address;
  private final long lengthBytes;
  private final RegionKind kind;
  private final int device;
  private final @Nullable SharedPages shared;
  private final @Nullable Runnable release;
  private volatile boolean closed;
  /** Transfers in flight: memory is freed once closed and none is. */
  private final PinGate pins = new PinGate(this::free);

  MemoryRegion(
      RegionRegistry registry,
      int id,
      long address,
      long lengthBytes,
      RegionKind kind,
      int device,
      @Nullable SharedPages shared,
      @Nullable Runnable release) {
    this.registry = registry;
    this.id = id;
    this.address = address;
    this.lengthBytes = lengthBytes;
    this.kind = Objects.requireNonNull(kind);
    this.device = device;
    this.shared = shared;
    this.release = release;
  }

  public int id() {
    return id;
  }

  /** Virtual address of the first byte in the owning process. */
  public long address() {
    return address;
  }

  public long lengthBytes() {
    return lengthBytes;
  }

  public RegionKind kind() {
    return kind;
  }

  /** GPU index for CUDA regions, -1 for host memory. */
  public int device() {
    return device;
  }

  /** Owner name of the registry (the engine id). */
  public String owner() {
    return registry.owner();
  }

  public RegionRegistry registry() {
    return registry;
  }

  public boolean isClosed() {
    return closed;
  }

  /** The transport-independent part of this region's descriptor. */
  public RegionDescriptor descriptor() {
    return new RegionDescriptor(
            id,
            lengthBytes,
            kind,
            device,
            owner(),
            ProcessHandle.current().pid(),
            address,
            HostIdentity.bootId(),
            "",
            0,
            new byte[0],
            new byte[0])
        .withSharedPages(shared);
  }

  /** How a process on this host maps this region's pages itself, or null where it cannot. */
  public @Nullable SharedPages sharedPages() {
    return shared;
  }

  /** Checks that {@code [offsetBytes, offsetBytes + length)} lies inside this region. */
  public void checkRange(long offsetBytes, long length) {
    if (closed) {
      throw new RegionBoundsException("region " + id + " of " + owner() + " is closed");
    }
    checkRange(id, owner(), lengthBytes, offsetBytes, length);
  }

  static void checkRange(int id, String owner, long regionLength, long offsetBytes, long length) {
    if (offsetBytes < 0 || length < 0 || offsetBytes > regionLength - length) {
      throw new RegionBoundsException(
          "range [" + offsetBytes + ", " + offsetBytes + " + " + length + ") lies outside region "
              + id + " of " + (owner.isEmpty() ? "?" : owner) + " (" + regionLength + " bytes)");
    }
  }

  /** A JNA pointer to {@code offsetBytes} into a host region, after a bounds check. */
  public Pointer pointer(long offsetBytes, long length) {
    requireHost();
    checkRange(offsetBytes, length);
    return new Pointer(address + offsetBytes);
  }

  /**
   * A direct buffer viewing {@code [offsetBytes, offsetBytes + length)} of a host region, after a
   * bounds check. The view is valid only while the region is open.
   */
  public ByteBuffer buffer(long offsetBytes, int length) {
    requireHost();
    checkRange(offsetBytes, length);
    return new Pointer(address).getByteBuffer(offsetBytes, length);
  }

  private void requireHost() {
    if (kind != RegionKind.HOST) {
      throw new UnsupportedOperationException(
          "region " + id + " is " + kind + " memory; host views need a HOST region");
    }
  }

  /**
   * Keeps the memory alive for one transfer: {@link #close()} deregisters at once but frees only
   * after the last pin is released, so a transport never copies into freed memory.
   *
   * @return false when the region is already closed (nothing is pinned then)
   */
  boolean tryPin() {
    return pins.tryPin();
  }

  /** Releases a pin taken by {@link #tryPin()}; frees the memory if the region closed meanwhile. */
  void unpin() {
    pins.unpin();
  }

  /**
   * Deregisters and, for memory kvferry allocated, frees it (once transfers still using it are
   * done). Idempotent.
   */
  @Override
  public void close() {
    synchronized (this) {
      if (closed) {
        return;
      }
      closed = true;
    }
    registry.forget(id);
    pins.close();
  }

  private void free() {
    if (release != null) {
      release.run();
    }
  }

  @Override
  public String toString() {
    return "MemoryRegion[id=" + id + ", owner=" + owner() + ", kind=" + kind + ", length="
        + lengthBytes + "]";
  }
}
