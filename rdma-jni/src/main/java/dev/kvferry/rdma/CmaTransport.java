package dev.kvferry.rdma;

import com.sun.jna.LastErrorException;
import com.sun.jna.Memory;
import com.sun.jna.Pointer;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;

/**
 * Cross-memory attach between processes on one host: {@code process_vm_writev} / {@code
 * process_vm_readv} copy straight between this process's region and the peer's, one-sided like an
 * RDMA write (the peer runs no code). A batch becomes as few syscalls as possible: runs that are
 * contiguous on one side merge into one iovec (each side merges on its own), and up to {@link
 * #IOV_MAX} iovecs go into each call; a short count resumes where the kernel stopped.
 *
 * <p>Where the copy runs, measured: handing a batch to a background thread costs about 12 us
 * (a thread wake-up), against about 1.5 us for a 4 KiB copy in the caller's thread. So batches up
 * to {@link TransportOptions#cmaInlineMaxBytes()} (1 MiB, some 250 us of copying) are copied in
 * the caller's thread, and larger ones on a small executor: {@code write} then returns a pending
 * status at once instead of blocking an actor for milliseconds, at under 0.1% of a 64 MiB
 * batch's time (HostTransferBench shows no difference between the two).
 *
 * <p>The peer must be on this host (same kernel boot id) and ptrace must be allowed (same user,
 * or {@code kernel.yama.ptrace_scope=0}, or CAP_SYS_PTRACE).
 */
public final class CmaTransport implements Transport {

  /** Most iovecs the kernel takes per side in one call (UIO_MAXIOV). */
  public static final int IOV_MAX = 1024;

  /** Largest single iovec we hand over; the kernel caps a call's total near 2 GiB anyway. */
  private static final long MAX_IOV_BYTES = 1L << 30;

  private final long inlineMaxBytes;
  private final TransferExecutor executor;
  private final ThreadLocal<Scratch> scratch = ThreadLocal.withInitial(Scratch::new);
  private volatile boolean closed;

  public CmaTransport() {
    this(TransportOptions.defaults());
  }

  public CmaTransport(TransportOptions options) {
    this.inlineMaxBytes = options.cmaInlineMaxBytes();
    this.executor = new TransferExecutor("cma", options.ioThreads());
  }

  @Override
  public String name() {
    return "cma";
  }

  @Override
  public TransferStatus write(MemoryRegion local, RegionDescriptor remote, TransferBatch batch) {
    return start(local, remote, batch, true);
  }

  @Override
  public TransferStatus read(MemoryRegion local, RegionDescriptor remote, TransferBatch batch) {
    return start(local, remote, batch, false);
  }

  /** The region's own descriptor: pid, base address and boot id are all a CMA peer needs. */
  @Override
  public RegionDescriptor describe(MemoryRegion local) {
    if (local.kind() != RegionKind.HOST) {
      throw new IllegalArgumentException(
          "cma moves host memory only; region " + local.id() + " is " + local.kind());
    }
    return local.descriptor();
  }

  @Override
  public void close() {
    closed = true;
    executor.close();
  }

  private TransferStatus start(
      MemoryRegion local, RegionDescriptor remote, TransferBatch batch, boolean toRemote) {
    String refusal = refusal(local, remote);
    if (refusal != null) {
      return TransferStatus.failed(refusal);
    }
    if (!local.tryPin()) {
      return TransferStatus.failed("cma: local region " + local.id() + " is closed");
    }
    boolean handedOff = false;
    try {
      for (int i = 0; i < batch.count(); i++) {
        local.checkRange(batch.localOffsets()[i], batch.sizes()[i]);
        remote.checkRange(batch.remoteOffsets()[i], batch.sizes()[i]);
      }
      long total = batch.totalBytes();
      if (total <= inlineMaxBytes) {
        TransferStatus status = TransferStatus.pending();
        copy(local, remote, batch, toRemote, total, status);
        return status;
      }
      TransferStatus status = TransferStatus.pending();
      handedOff = true;
      executor.submit(
          status, () -> copy(local, remote, batch, toRemote, total, status), local::unpin);
      return status;
    } catch (RegionBoundsException e) {
      return TransferStatus.failed("cma: " + e.getMessage() + "; nothing was moved");
    } finally {
      if (!handedOff) {
        local.unpin();
      }
    }
  }

  /** Why this pair of regions cannot be reached through CMA, or null when it can. */
  private String refusal(MemoryRegion local, RegionDescriptor remote) {
    if (closed) {
      return "cma transport is closed";
    }
    if (local.kind() != RegionKind.HOST || remote.kind() != RegionKind.HOST) {
      return "cma moves host memory only; local region " + local.id() + " is " + local.kind()
          + " and region " + remote.regionId() + " of " + owner(remote) + " is " + remote.kind();
    }
    if (remote.bootId().isEmpty() || !remote.bootId().equals(HostIdentity.bootId())) {
      return "cma reaches processes on this host only; region " + remote.regionId() + " of "
          + owner(remote) + " lives on another host (boot id '" + remote.bootId()
          + "', ours '" + HostIdentity.bootId() + "'): use the tcp transport";
    }
    if (remote.pid() <= 0 || remote.pid() > Integer.MAX_VALUE) {
      return "cma: region " + remote.regionId() + " of " + owner(remote) + " names no valid pid ("
          + remote.pid() + ")";
    }
    return null;
  }

  private void copy(
      MemoryRegion local,
      RegionDescriptor remote,
      TransferBatch batch,
      boolean toRemote,
      long total,
      TransferStatus status) {
    Scratch s = scratch.get();
    s.ensureCapacity(batch.count());
    int localSegments = s.merge(batch.localOffsets(), batch.sizes(), local.address(), true);
    int remoteSegments = s.merge(batch.remoteOffsets(), batch.sizes(), remote.baseAddress(), false);
    int pid = (int) remote.pid();
    // Cursors: segment index and bytes already done inside it, per side.
    int li = 0;
    int ri = 0;
    long lDone = 0;
    long rDone = 0;
    long moved = 0;
    while (moved < total) {
      int lCount = s.fillIovecs(s.localIov, s.localAddr, s.localLen, li, lDone, localSegments);
      int rCount = s.fillIovecs(s.remoteIov, s.remoteAddr, s.remoteLen, ri, rDone, remoteSegments);
      long n;
      try {
        n =
            toRemote
                ? LibC.process_vm_writev(pid, s.localIovAddress, lCount, s.remoteIovAddress, rCount, 0)
                : LibC.process_vm_readv(pid, s.localIovAddress, lCount, s.remoteIovAddress, rCount, 0);
      } catch (LastErrorException e) {
        if (e.getErrorCode() == LibC.EINTR) {
          continue;
        }
        status.fail(explain(e.getErrorCode(), toRemote, remote, moved, total));
        return;
      }
      if (n <= 0) {
        status.fail(
            call(toRemote) + " to pid " + pid + " of " + owner(remote) + " made no progress after "
                + moved + " of " + total + " bytes");
        return;
      }
      moved += n;
      // Advance both cursors by n bytes.
      long left = n;
      while (left > 0) {
        long room = s.localLen[li] - lDone;
        if (left < room) {
          lDone += left;
          left = 0;
        } else {
          left -= room;
          li++;
          lDone = 0;
        }
      }
      left = n;
      while (left > 0) {
        long room = s.remoteLen[ri] - rDone;
        if (left < room) {
          rDone += left;
          left = 0;
        } else {
          left -= room;
          ri++;
          rDone = 0;
        }
      }
    }
    status.succeed(total);
  }

  private static String call(boolean toRemote) {
    return toRemote ? "process_vm_writev" : "process_vm_readv";
  }

  private static String owner(RegionDescriptor remote) {
    return remote.owner().isEmpty() ? "?" : remote.owner();
  }

  /** Turns the errno of a failed call into what the user should know and do. */
  static String explain(int errno, boolean toRemote, RegionDescriptor remote, long moved, long total) {
    String name = LibC.errnoName(errno);
    String call = call(toRemote);
    String after = moved == 0 ? "" : " after " + moved + " of " + total + " bytes";
    return switch (errno) {
      case LibC.ESRCH -> "cma: peer process " + remote.pid() + " of " + owner(remote)
          + " is gone (" + name + " from " + call + after + ")";
      case LibC.EFAULT -> "cma: region " + remote.regionId() + " of " + owner(remote) + " (pid "
          + remote.pid() + ", base 0x" + Long.toHexString(remote.baseAddress()) + ", "
          + remote.lengthBytes() + " bytes) is not mapped in the peer (" + name + " from " + call
          + after + "); the peer freed the region or the descriptor is stale";
      case LibC.EPERM -> "cma: not permitted to access pid " + remote.pid() + " of "
          + owner(remote) + " (" + name + " from " + call + "): ptrace permission is needed. Run "
          + "both processes as the same user and allow it with `sysctl kernel.yama.ptrace_scope=0`"
          + ", or grant CAP_SYS_PTRACE, or have the peer call prctl(PR_SET_PTRACER, <our pid>); "
          + "in containers the seccomp profile must allow " + call;
      case LibC.ENOSYS -> "cma: this kernel has no " + call + " (" + name + "); use tcp";
      default -> "cma: " + call + " to pid " + remote.pid() + " of " + owner(remote)
          + " failed with " + name + " (" + LibC.strerror(errno) + ")" + after;
    };
  }

  /**
   * Per-thread buffers: merged segments of the current batch (grown as needed, then reused) and
   * the two native iovec arrays handed to the kernel.
   */
  private static final class Scratch {
    final Memory localIovMemory = new Memory(IOV_MAX * 16L);
    final Memory remoteIovMemory = new Memory(IOV_MAX * 16L);
    final long localIovAddress = Pointer.nativeValue(localIovMemory);
    final long remoteIovAddress = Pointer.nativeValue(remoteIovMemory);
    final ByteBuffer localIov =
        localIovMemory.getByteBuffer(0, IOV_MAX * 16L).order(ByteOrder.nativeOrder());
    final ByteBuffer remoteIov =
        remoteIovMemory.getByteBuffer(0, IOV_MAX * 16L).order(ByteOrder.nativeOrder());
    long[] localAddr = new long[64];
    long[] localLen = new long[64];
    long[] remoteAddr = new long[64];
    long[] remoteLen = new long[64];

    /** Room for the segments of a batch of {@code entries} (at most one segment per entry). */
    void ensureCapacity(int entries) {
      if (localAddr.length < entries) {
        int n = Math.max(entries, localAddr.length * 2);
        localAddr = new long[n];
        localLen = new long[n];
        remoteAddr = new long[n];
        remoteLen = new long[n];
      }
    }

    /** Merges one side's entries into segments (skipping empty ones); returns their count. */
    int merge(long[] offsets, long[] sizes, long base, boolean localSide) {
      long[] addr = localSide ? localAddr : remoteAddr;
      long[] len = localSide ? localLen : remoteLen;
      int count = 0;
      for (int i = 0; i < sizes.length; i++) {
        long size = sizes[i];
        if (size == 0) {
          continue;
        }
        long start = base + offsets[i];
        if (count > 0 && addr[count - 1] + len[count - 1] == start) {
          len[count - 1] += size;
        } else {
          addr[count] = start;
          len[count] = size;
          count++;
        }
      }
      return count;
    }

    /** Writes up to IOV_MAX iovecs from segment {@code first} (minus {@code done} bytes). */
    int fillIovecs(ByteBuffer iov, long[] addr, long[] len, int first, long done, int segments) {
      int count = Math.min(IOV_MAX, segments - first);
      for (int k = 0; k < count; k++) {
        long skip = k == 0 ? done : 0;
        iov.putLong(k * 16, addr[first + k] + skip);
        // A longer segment is finished by later calls, like any short count.
        iov.putLong(k * 16 + 8, Math.min(MAX_IOV_BYTES, len[first + k] - skip));
      }
      return count;
    }
  }
}
