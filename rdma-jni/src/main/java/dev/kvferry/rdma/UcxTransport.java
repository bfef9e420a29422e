package dev.kvferry.rdma;

import dev.kvferry.rdma.ucx.Ucx;
import dev.kvferry.rdma.ucx.UcxException;
import dev.kvferry.rdma.ucx.UcxWorker;
import java.util.Iterator;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.AtomicBoolean;

/**
 * UCX's one-sided put and get (libucp through JNA, {@link dev.kvferry.rdma.ucx}): the same calls
 * run over RDMA verbs on InfiniBand or RoCE, over shared memory between processes of one host and
 * over TCP elsewhere; UCX picks per peer among the transports {@link
 * TransportOptions#ucxTransports()} allows. Regions are mapped with {@code ucp_mem_map} when first
 * described, and their descriptors carry this worker's address and the packed remote key. A batch
 * is one put or get per block and one flush, run by the worker's progress thread; {@code write}
 * and {@code read} return a pending status at once. A peer that dies fails the batches in flight
 * to it (its endpoint reports the error), and one that stops answering fails them after the I/O
 * timeout.
 *
 * <p>Host memory only: GPU memory would need a UCX built with CUDA (Debian's is not).
 */
public final class UcxTransport implements Transport {

  private final UcxWorker worker;
  private final byte[] workerAddress;
  private final Map<MemoryRegion, UcxWorker.Mapping> mapped = new ConcurrentHashMap<>();
  /** Regions whose memory UCX allocated ({@link #allocateHost}); freed with their region. */
  private final Map<MemoryRegion, AllocatedMemory> allocated = new ConcurrentHashMap<>();
  private volatile boolean closed;

  /**
   * Opens a UCP context and worker with the options' UCX transports and I/O timeout.
   *
   * @throws dev.kvferry.rdma.ucx.UcxUnavailableException without a usable libucp
   * @throws UcxException naming the UCX call that failed (e.g. no transport in UCX_TLS exists here)
   */
  public UcxTransport(TransportOptions options) {
    this.worker = new UcxWorker(
        "ucx", options.ucxTransports(), options.ioTimeout().toNanos());
    this.workerAddress = worker.address();
  }

  @Override
  public String name() {
    return "ucx";
  }

  /** The loaded libucp's version, for logs and the bench. */
  public static String libraryVersion() {
    return Ucx.version();
  }

  /**
   * Maps the region with UCX on first use and returns its descriptor with this worker's address
   * and the packed remote key.
   *
   * @throws UcxException when ucp_mem_map or ucp_rkey_pack fails
   */
  @Override
  public RegionDescriptor describe(MemoryRegion local) {
    if (local.kind() != RegionKind.HOST) {
      throw new IllegalArgumentException(
          "ucx moves host memory only here (Debian's UCX is built without CUDA); region "
              + local.id() + " is " + local.kind());
    }
    if (closed) {
      throw new IllegalStateException("ucx transport is closed");
    }
    unmapClosedRegions();
    AllocatedMemory own = allocated.get(local);
    UcxWorker.Mapping mapping = own != null
        ? own.mapping
        : mapped.computeIfAbsent(local, r -> worker.map(r.address(), r.lengthBytes()));
    return local.descriptor().withUcx(workerAddress, mapping.packedRkey());
  }

  /**
   * Memory UCX allocates and maps itself. On one host UCX puts it in shared memory that a peer's
   * put reaches with a memcpy, where memory this process allocated costs a cma system call per
   * put; over RDMA it is registered memory like any other. The memory is freed once the region
   * is closed and no transfer uses it; closing this transport closes the regions it allocated
   * (their memory goes with UCX's context).
   *
   * @throws UcxException naming the UCX call that failed
   */
  @Override
  public MemoryRegion allocateHost(RegionRegistry registry, long lengthBytes) {
    if (lengthBytes <= 0) {
      throw new IllegalArgumentException("region length must be positive, got " + lengthBytes);
    }
    if (closed) {
      throw new IllegalStateException("ucx transport is closed");
    }
    UcxWorker.Allocation a = worker.allocate(lengthBytes);
    LibC.memset(a.address(), 0, lengthBytes); // zeroed and touched, as allocateHost's regions
    AllocatedMemory memory = new AllocatedMemory(a.mapping());
    MemoryRegion region =
        registry.registerExternal(a.address(), lengthBytes, RegionKind.HOST, -1, memory::free);
    allocated.put(region, memory);
    return region;
  }

  @Override
  public TransferStatus write(MemoryRegion local, RegionDescriptor remote, TransferBatch batch) {
    return start(local, remote, batch, true);
  }

  @Override
  public TransferStatus read(MemoryRegion local, RegionDescriptor remote, TransferBatch batch) {
    return start(local, remote, batch, false);
  }

  @Override
  public void close() {
    closed = true;
    // UCX must not outlive its memory's users nor keep it mapped past its context (its cleanup
    // aborted the process here with an allocated region still mapped): close, then free.
    for (Map.Entry<MemoryRegion, AllocatedMemory> e : allocated.entrySet()) {
      e.getKey().close();
      e.getValue().free();
    }
    allocated.clear();
    for (UcxWorker.Mapping m : mapped.values()) {
      try {
        worker.unmap(m);
      } catch (UcxException e) {
        // closing anyway: the context's cleanup releases it
      }
    }
    mapped.clear();
    worker.close();
  }

  private TransferStatus start(
      MemoryRegion local, RegionDescriptor remote, TransferBatch batch, boolean put) {
    if (closed) {
      return TransferStatus.failed("ucx transport is closed");
    }
    if (local.kind() != RegionKind.HOST || remote.kind() != RegionKind.HOST) {
      return TransferStatus.failed(
          "ucx moves host memory only here; local region " + local.id() + " is " + local.kind()
              + " and region " + remote.regionId() + " of " + owner(remote) + " is "
              + remote.kind());
    }
    if (remote.ucxWorkerAddress().length == 0 || remote.ucxRkey().length == 0) {
      return TransferStatus.failed(
          "region " + remote.regionId() + " of " + owner(remote) + " has no UCX worker address "
              + "and remote key in its descriptor; describe it with the peer's ucx transport");
    }
    TransferStatus refused = batch.pinAndCheck("ucx", local, remote);
    if (refused != null) {
      return refused;
    }
    TransferStatus status = TransferStatus.pending();
    worker.submit(
        put, remote.ucxWorkerAddress(), remote.ucxRkey(), local.address(), remote.baseAddress(),
        batch.localOffsets(), batch.remoteOffsets(), batch.sizes(),
        "region " + remote.regionId() + " of " + owner(remote), localPid(remote), status,
        local::unpin);
    return status;
  }

  private void unmapClosedRegions() {
    for (Iterator<Map.Entry<MemoryRegion, UcxWorker.Mapping>> it = mapped.entrySet().iterator();
        it.hasNext(); ) {
      Map.Entry<MemoryRegion, UcxWorker.Mapping> e = it.next();
      if (e.getKey().isClosed()) {
        it.remove();
        worker.unmap(e.getValue());
      }
    }
    allocated.keySet().removeIf(MemoryRegion::isClosed); // their own free unmaps them
  }

  /** Memory UCX allocated for a region: unmapped (which frees it) once, by whichever goes first. */
  private final class AllocatedMemory {
    final UcxWorker.Mapping mapping;
    private final AtomicBoolean freed = new AtomicBoolean();

    AllocatedMemory(UcxWorker.Mapping mapping) {
      this.mapping = mapping;
    }

    void free() {
      if (freed.compareAndSet(false, true)) {
        try {
          worker.unmap(mapping);
        } catch (RuntimeException e) {
          // the worker is already closed: its context's cleanup freed the memory
        }
      }
    }
  }

  /** The peer's pid when it runs on this host (same boot id), else 0. */
  private static long localPid(RegionDescriptor remote) {
    return !remote.bootId().isEmpty() && remote.bootId().equals(HostIdentity.bootId())
        ? remote.pid() : 0;
  }

  private static String owner(RegionDescriptor remote) {
    return remote.owner().isEmpty() ? "?" : remote.owner();
  }
}
