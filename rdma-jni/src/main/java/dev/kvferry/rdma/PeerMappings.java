package dev.kvferry.rdma;

import com.sun.jna.LastErrorException;
import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.AtomicInteger;
import org.jspecify.annotations.Nullable;

/**
 * The cma transport's mappings of peers' region pages ({@link SharedPages}), opened on first use
 * and kept until the peer leaves: a copy through one is a plain memcpy, with none of the per-page
 * pinning {@code process_vm_writev} pays. A region that cannot be mapped is remembered with the
 * reason, and its copies use the system calls.
 *
 * <p>A mapping keeps the peer's pages alive while mapped, so each is dropped when its peer leaves
 * ({@link #release}), after the copies using it are done (they pin it).
 */
final class PeerMappings implements AutoCloseable {

  /** One region of one peer process; the file identity guards against a reused fd number. */
  private record Key(long pid, String owner, SharedPages pages) {
    // Written out: the record's generated ones go through method handles, slow before the JIT
    // compiled them (PeerKey in the actors module says more); this key is looked up per copy.
    @Override
    public int hashCode() {
      return (31 * Long.hashCode(pid) + owner.hashCode()) * 31 + pages.hashCode();
    }

    @Override
    public boolean equals(@Nullable Object o) {
      return o instanceof Key k && pid == k.pid && owner.equals(k.owner) && pages.equals(k.pages);
    }
  }

  private final Map<Key, Object> entries = new ConcurrentHashMap<>(); // Mapping, or String: why not
  private final AtomicInteger opened = new AtomicInteger();

  /**
   * A pinned mapping of {@code remote}'s pages (unpin it after the copy), or null when it has
   * none or they cannot be mapped here.
   */
  @Nullable Mapping acquire(RegionDescriptor remote) {
    SharedPages pages = remote.sharedPages();
    if (pages == null) {
      return null;
    }
    Key key = new Key(remote.pid(), remote.owner(), pages);
    for (int attempt = 0; attempt < 2; attempt++) { // a release may close the one we found
      Object e = entries.computeIfAbsent(key, k -> open(k, remote.lengthBytes()));
      if (!(e instanceof Mapping m)) {
        return null;
      }
      if (m.length < remote.lengthBytes()) {
        return null; // never for our own sealed files; a descriptor that lies about its length
      }
      if (m.tryPin()) {
        return m;
      }
      entries.remove(key, m);
    }
    return null;
  }

  /** Why {@code remote}'s pages are not mapped here, or null when they are or were never tried. */
  @Nullable String refusal(RegionDescriptor remote) {
    SharedPages p = remote.sharedPages();
    if (p == null) {
      return "the region has no shared pages";
    }
    Object e = entries.get(new Key(remote.pid(), remote.owner(), p));
    return e instanceof String why ? why : null;
  }

  /** Mappings open now. */
  int open() {
    return (int) entries.values().stream().filter(Mapping.class::isInstance).count();
  }

  /** Mappings opened since this transport started (tests: was the mapped path taken). */
  int openedTotal() {
    return opened.get();
  }

  /** Drops what is kept for the peer process's {@code owner} (its mappings and refusals). */
  void release(long pid, String owner) {
    entries.entrySet().removeIf(e -> {
      if (e.getKey().pid() == pid && e.getKey().owner().equals(owner)) {
        if (e.getValue() instanceof Mapping m) {
          m.close();
        }
        return true;
      }
      return false;
    });
  }

  @Override
  public void close() {
    entries.values().forEach(e -> {
      if (e instanceof Mapping m) {
        m.close();
      }
    });
    entries.clear();
  }

  /** Opens, checks and maps the peer's file; on any doubt returns why not, mapping nothing. */
  private Object open(Key k, long length) {
    String path = k.pages().procPath(k.pid());
    int fd;
    try {
      fd = LibC.open(path, LibC.O_RDWR | LibC.O_CLOEXEC);
    } catch (LastErrorException e) {
      return "cannot open " + path + ": " + LibC.errnoName(e.getErrorCode());
    }
    try {
      SharedPages got = SharedPages.ofOwnDescriptor(fd);
      if (!got.sameFile(k.pages())) {
        return path + " is another file than the descriptor names (a closed, reused fd?)";
      }
      // Sealed against shrinking: no store through our mapping can ever fault past the end.
      int seals = LibC.fcntl(fd, LibC.F_GET_SEALS, 0);
      if ((seals & LibC.F_SEAL_SHRINK) == 0) {
        return path + " is not sealed against shrinking";
      }
      long size = Files.size(Path.of("/proc/self/fd/" + fd));
      if (size < length) {
        return path + " holds " + size + " bytes, the region " + length;
      }
      long address =
          LibC.mmap(0, length, LibC.PROT_READ | LibC.PROT_WRITE, LibC.MAP_SHARED, fd, 0);
      opened.incrementAndGet();
      return new Mapping(address, length);
    } catch (LastErrorException e) {
      return "cannot map " + path + ": " + LibC.errnoName(e.getErrorCode());
    } catch (IOException | RuntimeException e) {
      return "cannot check " + path + ": " + e;
    } finally {
      LibC.close(fd); // the mapping stays valid without the descriptor
    }
  }

  /** One peer region mapped here; unmapped once closed and no copy pins it. */
  static final class Mapping {
    final long address;
    final long length;
    private final PinGate pins;

    Mapping(long address, long length) {
      this.address = address;
      this.length = length;
      this.pins = new PinGate(() -> LibC.munmap(address, length));
    }

    boolean tryPin() {
      return pins.tryPin();
    }

    void unpin() {
      pins.unpin();
    }

    void close() {
      pins.close();
    }
  }
}
