package dev.kvferry.rdma;

import com.sun.jna.LastErrorException;
import java.security.SecureRandom;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.concurrent.atomic.AtomicInteger;
import org.jspecify.annotations.Nullable;

/**
 * The regions one owner (an engine worker) has registered, by id, plus the secret token that TCP
 * peers must present to reach them. Transports look regions up here before touching any byte.
 */
public final class RegionRegistry implements AutoCloseable {

  public static final long PAGE_BYTES = 4096;
  /** Transparent huge page size on x86-64 and (4K-page) arm64. */
  public static final long HUGE_PAGE_BYTES = 2L << 20;
  private static final SecureRandom RANDOM = new SecureRandom();

  private final String owner;
  private final byte[] token = new byte[16];
  private final Map<Integer, MemoryRegion> regions = new ConcurrentHashMap<>();
  private final AtomicInteger nextId = new AtomicInteger(1);

  public RegionRegistry(String owner) {
    this.owner = owner == null ? "" : owner;
    RANDOM.nextBytes(token);
  }

  public String owner() {
    return owner;
  }

  /** The secret a TCP peer must present; hand it out only over the authenticated control plane. */
  public byte[] token() {
    return token.clone();
  }

  /** Constant-time comparison of a presented token with ours. */
  public boolean tokenMatches(byte[] presented) {
    return presented != null && java.security.MessageDigest.isEqual(token, presented);
  }

  /**
   * Allocates {@code lengthBytes} of zeroed, page-aligned host memory outside the Java heap and
   * registers it. Regions of 2 MiB or more are 2 MiB aligned and asked to be backed by transparent
   * huge pages (granted to the memfd below only where shmem_enabled allows, to the anonymous
   * fallback where THP is madvise or always): the kernel then pins them for {@code
   * process_vm_writev} 512 times faster. Pages are touched here so no transfer pays for page
   * faults.
   *
   * <p>The memory is a sealed memfd kept open for the region's life ({@link SharedPages}), so a
   * cma peer on this host maps the same pages and copies with memcpy instead of {@code
   * process_vm_writev}. Where memfds are not available (seccomp, old kernels) the region is
   * anonymous memory and cma peers use the system calls.
   */
  public MemoryRegion allocateHost(long lengthBytes) {
    if (lengthBytes <= 0) {
      throw new IllegalArgumentException("region length must be positive, got " + lengthBytes);
    }
    boolean huge = lengthBytes >= HUGE_PAGE_BYTES;
    long align = huge ? HUGE_PAGE_BYTES : PAGE_BYTES;
    long rounded = (lengthBytes + align - 1) & ~(align - 1);
    long mappedBytes = rounded + (huge ? HUGE_PAGE_BYTES : 0);
    long raw;
    try {
      // Address space only: the region is placed inside it at the alignment it wants.
      raw =
          LibC.mmap(0, mappedBytes, LibC.PROT_READ | LibC.PROT_WRITE,
              LibC.MAP_PRIVATE | LibC.MAP_ANONYMOUS, -1, 0);
    } catch (LastErrorException e) {
      throw new OutOfMemoryError(
          "mmap of " + mappedBytes + " bytes for a region of " + owner + " failed: "
              + LibC.errnoName(e.getErrorCode()));
    }
    long aligned = (raw + align - 1) & ~(align - 1);
    SharedPages shared = sharedFileAt(aligned, rounded);
    if (huge) {
      try {
        LibC.madvise(aligned, rounded, LibC.MADV_HUGEPAGE);
      } catch (LastErrorException e) {
        // No transparent huge pages here: still correct, only CMA is slower.
      }
    }
    LibC.memset(aligned, 0, lengthBytes);
    Runnable free = () -> {
      LibC.munmap(raw, mappedBytes);
      if (shared != null) {
        LibC.close(shared.fd());
      }
    };
    return add(aligned, lengthBytes, RegionKind.HOST, -1, shared, free);
  }

  /**
   * Replaces {@code [address, address + length)} of our reserved range by a shared mapping of a
   * new memfd of that length, sealed against shrinking and growing. Returns null (the range stays
   * anonymous memory) when this host cannot: no memfd_create, no sealing, a failed mapping.
   */
  private @Nullable SharedPages sharedFileAt(long address, long length) {
    int fd;
    try {
      fd = LibC.memfd_create("kvferry-region", LibC.MFD_CLOEXEC | LibC.MFD_ALLOW_SEALING);
    } catch (LastErrorException | UnsatisfiedLinkError e) {
      return null;
    }
    try {
      LibC.ftruncate(fd, length);
      LibC.fcntl(fd, LibC.F_ADD_SEALS, LibC.F_SEAL_SHRINK | LibC.F_SEAL_GROW | LibC.F_SEAL_SEAL);
      long at = LibC.mmap(address, length, LibC.PROT_READ | LibC.PROT_WRITE,
          LibC.MAP_SHARED | LibC.MAP_FIXED, fd, 0);
      if (at != address) {
        throw new IllegalStateException("MAP_FIXED placed the region elsewhere");
      }
      return SharedPages.ofOwnDescriptor(fd);
    } catch (IOException | RuntimeException e) { // LastErrorException is one
      // A failed MAP_FIXED leaves the range as it was; our reservation is intact either way.
      LibC.close(fd);
      return null;
    }
  }

  /**
   * Maps {@code length} bytes at {@code offset} of a file another process shares with this one (an
   * engine's KV cache under /dev/shm) and registers them as host memory. The mapping is shared, so
   * bytes the engine writes are the bytes transports move, and it is unmapped once the region is
   * closed and no transfer uses it. The file is never truncated or deleted.
   *
   * @throws IOException naming the file when it cannot be opened or mapped, or is too short
   */
  public MemoryRegion mapSharedFile(Path path, long offset, long length) throws IOException {
    if (offset < 0 || length <= 0) {
      throw new IllegalArgumentException(
          path + ": offset must be >= 0 and length > 0, got " + offset + " and " + length);
    }
    long size = Files.size(path);
    if (offset + length > size) {
      throw new IOException(path + " holds " + size + " bytes; bytes " + offset + ".."
          + (offset + length) + " were asked for");
    }
    int fd;
    try {
      fd = LibC.open(path.toString(), LibC.O_RDWR | LibC.O_CLOEXEC);
    } catch (LastErrorException e) {
      throw new IOException("cannot open " + path + ": " + LibC.errnoName(e.getErrorCode()), e);
    }
    try {
      // mmap wants a page-aligned file offset: map from the page holding `offset`.
      long pageStart = offset & ~(PAGE_BYTES - 1);
      long slack = offset - pageStart;
      long mapped = length + slack;
      long base =
          LibC.mmap(0, mapped, LibC.PROT_READ | LibC.PROT_WRITE, LibC.MAP_SHARED, fd, pageStart);
      return add(base + slack, length, RegionKind.HOST, -1, null, () -> LibC.munmap(base, mapped));
    } catch (LastErrorException e) {
      throw new IOException("cannot map " + length + " bytes of " + path + " at " + offset + ": "
          + LibC.errnoName(e.getErrorCode()), e);
    } finally {
      LibC.close(fd); // the mapping stays valid without the descriptor
    }
  }

  /**
   * Registers memory kvferry does not own (a GPU allocation, a tensor of the engine). The caller
   * keeps it alive until the region is closed.
   */
  public MemoryRegion registerExternal(long address, long lengthBytes, RegionKind kind, int device) {
    return registerExternal(address, lengthBytes, kind, device, null);
  }

  /**
   * As {@link #registerExternal(long, long, RegionKind, int)}, handing the memory over: {@code
   * free} runs once the region is closed and no transfer uses it any more (on whichever thread
   * releases it last).
   */
  public MemoryRegion registerExternal(
      long address, long lengthBytes, RegionKind kind, int device, @Nullable Runnable free) {
    if (address == 0 || lengthBytes <= 0) {
      throw new IllegalArgumentException(
          "external region needs a non-null address and positive length, got 0x"
              + Long.toHexString(address) + " and " + lengthBytes);
    }
    return add(address, lengthBytes, kind, device, null, free);
  }

  private MemoryRegion add(
      long address,
      long length,
      RegionKind kind,
      int device,
      @Nullable SharedPages shared,
      @Nullable Runnable free) {
    int id = nextId.getAndIncrement();
    MemoryRegion region = new MemoryRegion(this, id, address, length, kind, device, shared, free);
    regions.put(id, region);
    return region;
  }

  /** The open region with this id, or null. */
  public @Nullable MemoryRegion lookup(int regionId) {
    return regions.get(regionId);
  }

  public int size() {
    return regions.size();
  }

  void forget(int id) {
    regions.remove(id);
  }

  /** Closes every region still registered. */
  @Override
  public void close() {
    for (MemoryRegion r : regions.values()) {
      r.close();
    }
  }
}
