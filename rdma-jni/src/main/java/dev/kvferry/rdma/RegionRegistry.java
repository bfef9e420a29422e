package dev.kvferry.rdma;

import com.sun.jna.Memory;
import com.sun.jna.Pointer;
import java.security.SecureRandom;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.AtomicInteger;

/**
 * The regions one owner (an engine worker) has registered, by id, plus the secret token that TCP
 * peers must present to reach them. Transports look regions up here before touching any byte.
 */
public final class RegionRegistry implements AutoCloseable {

  public static final long PAGE_BYTES = 4096;
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
   * registers it.
   */
  public MemoryRegion allocateHost(long lengthBytes) {
    if (lengthBytes <= 0) {
      throw new IllegalArgumentException("region length must be positive, got " + lengthBytes);
    }
    // Over-allocate by a page and align inside: JNA's Memory is malloc'd, not page aligned.
    Memory memory = new Memory(lengthBytes + PAGE_BYTES);
    long raw = Pointer.nativeValue(memory);
    long aligned = (raw + PAGE_BYTES - 1) & ~(PAGE_BYTES - 1);
    memory.clear();
    return add(aligned, lengthBytes, RegionKind.HOST, -1, memory::close);
  }

  /**
   * Registers memory kvferry does not own (a GPU allocation, a tensor of the engine). The caller
   * keeps it alive until the region is closed.
   */
  public MemoryRegion registerExternal(long address, long lengthBytes, RegionKind kind, int device) {
    if (address == 0 || lengthBytes <= 0) {
      throw new IllegalArgumentException(
          "external region needs a non-null address and positive length, got 0x"
              + Long.toHexString(address) + " and " + lengthBytes);
    }
    return add(address, lengthBytes, kind, device, null);
  }

  private MemoryRegion add(long address, long length, RegionKind kind, int device, Runnable free) {
    int id = nextId.getAndIncrement();
    MemoryRegion region = new MemoryRegion(this, id, address, length, kind, device, free);
    regions.put(id, region);
    return region;
  }

  /** The open region with this id, or null. */
  public MemoryRegion lookup(int regionId) {
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
