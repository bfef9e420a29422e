package dev.kvferry.rdma;

import com.sun.jna.Memory;
import dev.kvferry.rdma.cuda.Cuda;
import dev.kvferry.rdma.cuda.CudaEvent;
import dev.kvferry.rdma.cuda.CudaEventPoller;
import dev.kvferry.rdma.cuda.CudaException;
import dev.kvferry.rdma.cuda.CudaKernels;
import dev.kvferry.rdma.cuda.KernelArgs;
import dev.kvferry.rdma.cuda.PlanBuffers;
import dev.kvferry.rdma.cuda.ScatterPlan;
import dev.kvferry.rdma.cuda.SharedDoneWords;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.LinkedHashSet;
import java.util.List;
import java.util.Map;
import java.util.Objects;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import org.jspecify.annotations.Nullable;

/**
 * GPU memory between processes on one host: the peer's allocation is opened once through its CUDA
 * IPC handle (cached per allocation and local device), and a whole batch moves with ONE launch on
 * the copy stream kept per peer: the scatter-copy kernel of {@link CudaKernels} or one {@code
 * cudaMemcpyBatchAsync}, by default whichever was measured faster for the batch's shape. The same
 * code copies within one GPU or across GPUs over NVLink;
 * only the device ids differ. The kernel runs on the local region's device: WRITE pushes into the
 * peer's memory, READ pulls from it.
 *
 * <p>No thread waits for a transfer: an event is recorded after the copies and the shared {@link
 * CudaEventPoller} completes the status when it fires. {@link #writeAfter} also orders the copies
 * behind a compute event on the GPU ({@code cudaStreamWaitEvent}), so the compute stream is never
 * stalled and no CPU thread waits for the layer.
 *
 * <p>Descriptors carry {@code cuda_ipc_handle} as 72 bytes: the 64-byte {@code
 * cudaIpcMemHandle_t} of the allocation holding the region, then the region's offset within that
 * allocation (8 bytes, little endian).
 */
public final class CudaTransport implements EventOrderedTransport {

  /** How a batch is moved; each takes one call per batch. */
  public enum CopyMethod {
    /** kvferry's scatter-copy kernel: SMs copy, any number of entries, one launch. */
    KERNEL,
    /** {@code cudaMemcpyBatchAsync} (CUDA 12.8+): the driver picks copy engines or SMs. */
    MEMCPY_BATCH,
    /**
     * Per batch, the one measured faster for its shape (docs/gpu.md, H200): MEMCPY_BATCH when the
     * entries average at least {@link #LARGE_ENTRY_BYTES} (merged runs: 5-7% faster, and copy
     * engines leave the SMs to compute), else KERNEL (16-token blocks: ~200x faster).
     */
    AUTO;

    /** The system property that picks the method of the "cuda" transport a node opens. */
    public static final String PROPERTY = "kvferry.cuda.copy-method";

    /**
     * {@code auto}, {@code kernel} or {@code memcpy-batch} (any case, {@code _} for {@code -}).
     *
     * @throws IllegalArgumentException naming the valid values
     */
    public static CopyMethod parse(String name) {
      String n = name.trim().toUpperCase(java.util.Locale.ROOT).replace('-', '_');
      for (CopyMethod m : values()) {
        if (m.name().equals(n)) {
          return m;
        }
      }
      throw new IllegalArgumentException(PROPERTY + " = '" + name
          + "' is not a copy method; valid: auto, kernel, memcpy-batch");
    }

    /** The method {@link #PROPERTY} names, {@link #AUTO} when it is not set. */
    public static CopyMethod configured() {
      return parse(System.getProperty(PROPERTY, "auto"));
    }
  }

  /**
   * Average entry size from which AUTO uses cudaMemcpyBatchAsync. Measured: 64 MiB entries favour
   * the batch copy, 32 KiB entries the kernel by far; sizes between were not measured.
   */
  public static final long LARGE_ENTRY_BYTES = 1L << 20;

  static final int IPC_DESCRIPTOR_BYTES = Cuda.IPC_HANDLE_BYTES + 8;
  private static final int PLANS_PER_LANE = 32;
  /** Plan buffers kept free per device for the next plans (page-locked host + device each). */
  private static final long POOLED_PLAN_BYTES = 16L << 20;
  private static final long OWN_PID = ProcessHandle.current().pid();

  private final CopyMethod method;
  private final CudaEventPoller poller;
  /** Remote allocations opened through IPC, by local device and handle: base and real size. */
  private final Map<AllocationKey, Opened> openedAllocations = new ConcurrentHashMap<>();
  /**
   * Regions any cuda transport of this process described, by address, with their length: the only
   * memory a descriptor naming this process may reach without IPC. The pid, boot id and address
   * come off the wire; a peer must not be able to point our copies at any other memory of ours.
   */
  private static final Map<Long, Long> DESCRIBED_HERE = new ConcurrentHashMap<>();

  private record Opened(long base, long bytes) {}

  /**
   * GPU memory another process shared with this one (an engine's KV cache, opened here through
   * its IPC handle), by its address here: the descriptor bytes naming the owner's allocation.
   * CUDA does not export memory a process imported, so peers are given the owner's handle.
   */
  private static final Map<Long, byte[]> IMPORTED = new ConcurrentHashMap<>();

  /**
   * Describes the region at {@code address} (memory this process opened through {@code
   * allocationHandle}) to peers as that allocation at {@code offsetInAllocation}, so they open
   * the owner's allocation directly.
   */
  public static void describeImportedAs(
      long address, byte[] allocationHandle, long offsetInAllocation) {
    if (allocationHandle.length != Cuda.IPC_HANDLE_BYTES || offsetInAllocation < 0) {
      throw new IllegalArgumentException("an IPC handle of " + Cuda.IPC_HANDLE_BYTES
          + " bytes and an offset of at least 0, got " + allocationHandle.length + " bytes and "
          + offsetInAllocation);
    }
    IMPORTED.put(address, ByteBuffer.allocate(IPC_DESCRIPTOR_BYTES)
        .order(ByteOrder.LITTLE_ENDIAN)
        .put(allocationHandle)
        .putLong(offsetInAllocation)
        .array());
  }

  /** The imported memory at {@code address} is unmapped: forget how it was described. */
  public static void forgetImported(long address) {
    IMPORTED.remove(address);
  }

  /** Which opened allocations (keys of openedAllocations) belong to which peer process. */
  private final Map<PeerProcess, Set<AllocationKey>> allocationsByPeer =
      new ConcurrentHashMap<>();

  // The map keys below write hashCode and equals out: a record's generated ones go through method
  // handles, slow in code not compiled yet, and these are looked up on every copy (PeerKey says more).

  /** A peer process: its host's boot id and its pid. */
  private record PeerProcess(String bootId, long pid) {
    static PeerProcess of(RegionDescriptor remote) {
      return new PeerProcess(remote.bootId(), remote.pid());
    }

    @Override
    public int hashCode() {
      return 31 * bootId.hashCode() + Long.hashCode(pid);
    }

    @Override
    public boolean equals(@Nullable Object o) {
      return o instanceof PeerProcess p && pid == p.pid && bootId.equals(p.bootId);
    }
  }

  /** A copy lane: from our device to one device of one peer process. */
  private record LaneKey(int device, PeerProcess peer, int remoteDevice) {
    @Override
    public int hashCode() {
      return (31 * device + peer.hashCode()) * 31 + remoteDevice;
    }

    @Override
    public boolean equals(@Nullable Object o) {
      return o instanceof LaneKey k && device == k.device && remoteDevice == k.remoteDevice
          && peer.equals(k.peer);
    }
  }

  /** An IPC-opened allocation: our device and the 64-byte handle (compared by content). */
  private record AllocationKey(int device, ByteBuffer handle) {
    @Override
    public int hashCode() {
      return 31 * device + handle.hashCode();
    }

    @Override
    public boolean equals(@Nullable Object o) {
      return o instanceof AllocationKey k && device == k.device && handle.equals(k.handle);
    }
  }
  private final Map<LaneKey, Lane> lanes = new ConcurrentHashMap<>();
  /** Per local device, the stream that joins several lanes for {@link #recordAfterCopies}. */
  private final Map<Integer, Join> joins = new ConcurrentHashMap<>();
  /** Per local device, the buffers plans are uploaded through, reused from plan to plan. */
  private final Map<Integer, PlanBuffers> planBuffers = new ConcurrentHashMap<>();
  private final Map<Long, byte[]> describedHandles = new ConcurrentHashMap<>();
  private volatile boolean closed;

  /** A transport choosing the copy method per batch ({@link CopyMethod#AUTO}). */
  public CudaTransport() {
    this(CopyMethod.AUTO);
  }

  /** @throws dev.kvferry.rdma.cuda.CudaUnavailableException when this host has no usable CUDA */
  public CudaTransport(CopyMethod method) {
    Cuda.require();
    if (method == CopyMethod.MEMCPY_BATCH && !Cuda.hasMemcpyBatch()) {
      throw new IllegalArgumentException(
          "cudaMemcpyBatchAsync needs CUDA 12.8 or later; runtime is " + Cuda.runtimeVersion());
    }
    this.method = method == CopyMethod.AUTO && !Cuda.hasMemcpyBatch() ? CopyMethod.KERNEL : method;
    this.poller = CudaEventPoller.common();
  }

  @Override
  public String name() {
    return "cuda";
  }

  public CopyMethod method() {
    return method;
  }

  @Override
  public TransferStatus write(MemoryRegion local, RegionDescriptor remote, TransferBatch batch) {
    return start(null, local, remote, batch, true);
  }

  @Override
  public TransferStatus read(MemoryRegion local, RegionDescriptor remote, TransferBatch batch) {
    return start(null, local, remote, batch, false);
  }

  @Override
  public TransferStatus writeAfter(
      CudaEvent after, MemoryRegion local, RegionDescriptor remote, TransferBatch batch) {
    return start(after, local, remote, batch, true);
  }

  @Override
  public TransferStatus readAfter(
      CudaEvent after, MemoryRegion local, RegionDescriptor remote, TransferBatch batch) {
    return start(after, local, remote, batch, false);
  }

  @Override
  public void signalWhenCopied(
      MemoryRegion local, RegionDescriptor remote, long wordDeviceAddress, long value) {
    int device = local.device(); // the lane sets it current for its calls
    lanes.computeIfAbsent(laneKey(device, remote), k -> new Lane(device))
        .writeValue(wordDeviceAddress, value);
  }

  /**
   * One lane's stream gets the record directly; several lanes each record their join event, which
   * the device's join stream waits for before the record, so the event covers all of them.
   */
  @Override
  public void recordAfterCopies(
      CudaEvent event, MemoryRegion local, List<RegionDescriptor> remotes) {
    int device = local.device();
    if (event.device() != device) {
      throw new IllegalArgumentException("event of device " + event.device()
          + " recorded behind copies of region " + local.id() + " on device " + device);
    }
    synchronized (event) {
      if (closed || event.isClosed()) {
        return; // the worker's session or this transport ended: no stream waits for it any more
      }
      recordBehindLanes(event, device, remotes);
    }
  }

  private void recordBehindLanes(CudaEvent event, int device, List<RegionDescriptor> remotes) {
    Cuda.setDevice(device);
    Set<LaneKey> keys = new LinkedHashSet<>();
    for (RegionDescriptor r : remotes) {
      keys.add(laneKey(device, r));
    }
    List<Lane> open = new ArrayList<>(keys.size());
    for (LaneKey k : keys) {
      Lane lane = lanes.get(k);
      if (lane != null) {
        open.add(lane); // no lane: nothing was queued to that peer (or it left: copies done)
      }
    }
    Join join = joins.computeIfAbsent(device, Join::new);
    synchronized (join) {
      if (join.closed) {
        return; // the transport closed meanwhile, after its streams had finished
      }
      if (open.size() == 1) {
        Lane lane = open.get(0);
        synchronized (lane) {
          if (!lane.closed) {
            Cuda.eventRecord(event.handle(), lane.stream);
            return;
          }
        }
      }
      // Several lanes (or none open): the join stream waits for each, then records. A lane
      // closed when its peer left, after its stream had finished.
      for (Lane lane : open) {
        synchronized (lane) {
          if (!lane.closed) {
            Cuda.eventRecord(lane.joinEvent, lane.stream);
            Cuda.streamWaitEvent(join.stream, lane.joinEvent);
          }
        }
      }
      Cuda.eventRecord(event.handle(), join.stream);
    }
  }

  @Override
  public boolean storesDoneWords() {
    return true;
  }

  /** D's words, mapped here and writable from every GPU ({@link SharedDoneWords#openPeerWords}). */
  @Override
  public PeerDoneWords openPeerDoneWords(String name, int slots) {
    SharedDoneWords words = SharedDoneWords.openPeerWords(name, slots);
    return new PeerDoneWords() {
      /** Set under this object's lock by close: no CPU store into the words after it. */
      private boolean wordsClosed;

      /**
       * Queued on the copy stream right behind the transfer's last copies when nothing else was
       * queued on it since ({@link Lane#writeValueAfter}): the writes need only have been
       * submitted. Otherwise the stream holds other work behind them (another request's copies,
       * waiting for its layers' compute), and a store there would wait for that too: the CPU
       * stores the word once the poller has seen the transfer's writes land.
       */
      @Override
      public TransferStatus storeAfter(
          List<TransferStatus> writes, MemoryRegion local, RegionDescriptor remote, int slot,
          long value) {
        for (TransferStatus w : writes) {
          if (w.state() == TransferStatus.State.FAILED) {
            return TransferStatus.failed("done word not stored: a write of the transfer failed ("
                + w.failureMessage() + ")");
          }
        }
        long address = words.deviceAddress(slot);
        // Under the words' lock, as close sets wordsClosed before it drains the streams: a store
        // queued here is drained before the words are unregistered, or not queued at all.
        synchronized (this) {
          if (wordsClosed) {
            return TransferStatus.failed("done word not stored: " + words.name() + " was closed");
          }
          if (writes.isEmpty()) {
            signalWhenCopied(local, remote, address, value);
            return TransferStatus.succeeded(Long.BYTES);
          }
          Lane lane = lanes.get(laneKey(local.device(), remote));
          if (lane != null
              && lane.writeValueAfter(writes.get(writes.size() - 1), address, value)) {
            return TransferStatus.succeeded(Long.BYTES);
          }
        }
        return PeerDoneWords.storeWhenLanded(writes, stored -> {
          synchronized (this) {
            if (wordsClosed) {
              stored.fail("done word not stored: " + words.name() + " was closed");
            } else {
              words.set(slot, value); // D polls words a GPU may store: no bell to ring
              stored.succeed(Long.BYTES);
            }
          }
        });
      }

      /**
       * Only onto a copy lane to that peer that exists: with none there are no copies to follow,
       * and a lane made for a hint (the peer gone, its lanes closed) would live until we close.
       */
      @Override
      public void hintAfterQueued(
          MemoryRegion local, RegionDescriptor remote, int slot, long value) {
        Lane lane = lanes.get(laneKey(local.device(), remote));
        if (lane == null) {
          return;
        }
        // Under the words' lock, as storeAfter: queued before close drains the lanes, or not at
        // all (a writer stopping runs close on its own thread, beside the submissions' queue).
        synchronized (this) {
          if (!wordsClosed) {
            lane.writeValue(words.deviceAddress(slot), value);
          }
        }
      }

      /**
       * A store into these words may still be queued on a copy stream (a writer stopped with a
       * transfer in flight): the streams finish their queued work before the words' memory is
       * unregistered, or the GPU would write into memory no longer mapped for it.
       */
      @Override
      public void close() {
        synchronized (this) {
          wordsClosed = true;
        }
        if (!closed) {
          for (Lane lane : lanes.values()) {
            try {
              lane.drain();
            } catch (RuntimeException e) {
              // a failed context runs nothing more: unregistering is safe then
            }
          }
        }
        words.close();
      }
    };
  }

  /** The region's descriptor plus the IPC handle of its allocation and its offset in it. */
  @Override
  public RegionDescriptor describe(MemoryRegion local) {
    if (local.kind() != RegionKind.CUDA) {
      throw new IllegalArgumentException(
          "cuda moves GPU memory only; region " + local.id() + " is " + local.kind());
    }
    byte[] imported = IMPORTED.get(local.address());
    byte[] handle = imported != null ? imported :
        describedHandles.computeIfAbsent(
            local.address(),
            address -> {
              Cuda.setDevice(local.device());
              long[] range = Cuda.allocationRange(address);
              byte[] ipc = Cuda.ipcGetMemHandle(range[0]);
              return ByteBuffer.allocate(IPC_DESCRIPTOR_BYTES)
                  .order(ByteOrder.LITTLE_ENDIAN)
                  .put(ipc)
                  .putLong(address - range[0])
                  .array();
            });
    DESCRIBED_HERE.merge(local.address(), local.lengthBytes(), Math::max);
    return local.descriptor().withCudaIpcHandle(handle.clone());
  }

  /**
   * Why a descriptor naming this process may not be used as it is, or null: its address must be a
   * region described here, and its length no more than that region's.
   */
  static @Nullable String sameProcessRefusal(RegionDescriptor remote, Map<Long, Long> describedHere) {
    Long length = describedHere.get(remote.baseAddress());
    if (length == null) {
      return "cuda: region " + remote.regionId() + " of " + owner(remote)
          + " claims to be in this process at 0x" + Long.toHexString(remote.baseAddress())
          + ", where no region was described; refused";
    }
    if (remote.lengthBytes() > length) {
      return "cuda: region " + remote.regionId() + " of " + owner(remote) + " claims "
          + remote.lengthBytes() + " bytes at 0x" + Long.toHexString(remote.baseAddress())
          + "; the region described there has " + length + "; refused";
    }
    return null;
  }

  /**
   * Why a region opened through IPC may not be used, or null: the range it claims, {@code
   * lengthBytes} from {@code offsetInAllocation}, must lie within the allocation the driver
   * opened, {@code allocationBytes} long (cuMemGetAddressRange), not just within what the peer
   * says.
   */
  static @Nullable String ipcRangeRefusal(
      RegionDescriptor remote, long offsetInAllocation, long allocationBytes) {
    if (offsetInAllocation < 0
        || offsetInAllocation > allocationBytes
        || remote.lengthBytes() > allocationBytes - offsetInAllocation) {
      return "cuda: region " + remote.regionId() + " of " + owner(remote) + " claims "
          + remote.lengthBytes() + " bytes at offset " + offsetInAllocation
          + " of an allocation the driver says has " + allocationBytes + " bytes; refused";
    }
    return null;
  }

  private TransferStatus start(
      @Nullable CudaEvent after,
      MemoryRegion local,
      RegionDescriptor remote,
      TransferBatch batch,
      boolean toRemote) {
    String refusal = refusal(local, remote);
    if (refusal != null) {
      return TransferStatus.failed(refusal);
    }
    if (!local.tryPin()) {
      return TransferStatus.failed("cuda: local region " + local.id() + " is closed");
    }
    boolean handedOff = false;
    try {
      batch.checkWithin(local, remote);
      int device = local.device();
      Cuda.setDevice(device);
      long remoteBase = remoteBase(device, remote);
      Lane lane = lanes.computeIfAbsent(laneKey(device, remote), k -> new Lane(device));
      TransferStatus status = TransferStatus.pending();
      long bytes = batch.totalBytes();
      synchronized (lane) {
        if (lane.closed) {
          return TransferStatus.failed("cuda: " + owner(remote) + " left while this transfer"
              + " started; nothing was moved");
        }
        if (after != null) {
          Cuda.streamWaitEvent(lane.stream, after.handle());
        }
        if (methodFor(method, batch) == CopyMethod.KERNEL) {
          lane.plan(batch).launch(Objects.requireNonNull(lane.kernels, "kernel method without kernels"),
              local.address(), remoteBase, toRemote, lane.stream, lane.args);
        } else {
          lane.memcpyBatch(batch, local.address(), remoteBase, toRemote);
        }
        long done = lane.takeEvent();
        Cuda.eventRecord(done, lane.stream);
        lane.lastQueued = status;
        handedOff = true;
        // Watched under the lane's lock, so the poller's queue for the stream is in record order.
        poller.watchInOrder(
            lane.stream,
            done,
            () -> {
              lane.returnEvent(done);
              local.unpin();
              status.succeed(bytes);
            },
            e -> {
              local.unpin();
              status.fail("cuda: copies to/from region " + remote.regionId() + " of "
                  + owner(remote) + " failed on the GPU: " + e.getMessage());
            });
      }
      return status;
    } catch (RegionBoundsException e) {
      return TransferStatus.failed("cuda: " + e.getMessage() + "; nothing was moved");
    } catch (CudaException e) {
      return TransferStatus.failed("cuda: transfer with region " + remote.regionId() + " of "
          + owner(remote) + " failed: " + e.getMessage());
    } finally {
      if (!handedOff) {
        local.unpin();
      }
    }
  }

  /** The method that moves {@code batch}: AUTO resolved by the batch's average entry size. */
  static CopyMethod methodFor(CopyMethod configured, TransferBatch batch) {
    if (configured != CopyMethod.AUTO) {
      return configured;
    }
    return batch.count() > 0 && batch.totalBytes() / batch.count() >= LARGE_ENTRY_BYTES
        ? CopyMethod.MEMCPY_BATCH
        : CopyMethod.KERNEL;
  }

  private @Nullable String refusal(MemoryRegion local, RegionDescriptor remote) {
    if (closed) {
      return "cuda transport is closed";
    }
    if (local.kind() != RegionKind.CUDA || remote.kind() != RegionKind.CUDA) {
      return "cuda moves GPU memory only; local region " + local.id() + " is " + local.kind()
          + " and region " + remote.regionId() + " of " + owner(remote) + " is " + remote.kind();
    }
    if (remote.pid() == OWN_PID && remote.bootId().equals(HostIdentity.bootId())) {
      // Same process: the address is usable as it is, if it is one of the regions we described.
      return sameProcessRefusal(remote, DESCRIBED_HERE);
    }
    if (!remote.bootId().equals(HostIdentity.bootId())) {
      return "cuda: region " + remote.regionId() + " of " + owner(remote)
          + " is on another host; CUDA IPC reaches GPUs of this host only (use tcp)";
    }
    if (remote.cudaIpcHandle().length != IPC_DESCRIPTOR_BYTES) {
      return "cuda: region " + remote.regionId() + " of " + owner(remote)
          + " came without a CUDA IPC handle (" + remote.cudaIpcHandle().length
          + " bytes, want " + IPC_DESCRIPTOR_BYTES + "); was it described by a cuda transport?";
    }
    return null;
  }

  /** The remote region's address in this process, opening its allocation on first use. */
  private long remoteBase(int device, RegionDescriptor remote) {
    if (remote.pid() == OWN_PID && remote.bootId().equals(HostIdentity.bootId())) {
      if (remote.device() != device && remote.device() >= 0) {
        Cuda.enablePeerAccess(remote.device());
      }
      return remote.baseAddress();
    }
    byte[] h = remote.cudaIpcHandle();
    long offset = ByteBuffer.wrap(h, Cuda.IPC_HANDLE_BYTES, 8).order(ByteOrder.LITTLE_ENDIAN).getLong();
    // A key by value, not a hex string built per batch.
    AllocationKey key = new AllocationKey(device, ByteBuffer.wrap(h, 0, Cuda.IPC_HANDLE_BYTES));
    Opened opened =
        openedAllocations.computeIfAbsent(
            key,
            k -> {
              long base = Cuda.ipcOpenMemHandle(java.util.Arrays.copyOf(h, Cuda.IPC_HANDLE_BYTES));
              long[] range = Cuda.allocationRange(base); // the driver's size, not the peer's
              allocationsByPeer
                  .computeIfAbsent(PeerProcess.of(remote), p -> ConcurrentHashMap.newKeySet())
                  .add(k);
              return new Opened(base, range[0] + range[1] - base);
            });
    String refusal = ipcRangeRefusal(remote, offset, opened.bytes());
    if (refusal != null) {
      throw new RegionBoundsException(refusal);
    }
    return opened.base() + offset;
  }

  private static LaneKey laneKey(int device, RegionDescriptor remote) {
    return new LaneKey(device, PeerProcess.of(remote), remote.device());
  }

  /**
   * Closes the copy lanes to the peer's process (each waits for its queued copies first) and then
   * its IPC mappings, instead of keeping them until this transport closes.
   */
  @Override
  public void peerGone(RegionDescriptor peerRegion) {
    if (closed || !Cuda.available()) {
      return;
    }
    PeerProcess peer = PeerProcess.of(peerRegion);
    for (LaneKey key : lanes.keySet()) {
      if (key.peer().equals(peer)) {
        Lane lane = lanes.remove(key);
        if (lane != null) {
          lane.close();
        }
      }
    }
    Set<AllocationKey> opened = allocationsByPeer.remove(peer);
    if (opened != null) {
      for (AllocationKey k : opened) {
        Opened o = openedAllocations.remove(k);
        if (o != null) {
          Cuda.setDevice(k.device());
          Cuda.ipcCloseMemHandle(o.base());
        }
      }
    }
  }

  private static String owner(RegionDescriptor d) {
    return d.owner().isEmpty() ? "pid " + d.pid() : d.owner();
  }

  /** True once {@link #close} ran: nothing more moves through it. */
  public boolean isClosed() {
    return closed;
  }

  /** Plan buffers allocated so far, every device (the rest of the plans reused one). */
  public long planBufferAllocations() {
    return planBuffers.values().stream().mapToLong(PlanBuffers::allocations).sum();
  }

  /** Number of remote allocations opened through IPC so far (each once per local device). */
  public int openedAllocations() {
    return openedAllocations.size();
  }

  /** Waits for queued copies, then frees streams, plans and IPC mappings. */
  @Override
  public void close() {
    if (closed) {
      return;
    }
    closed = true;
    for (Lane lane : lanes.values()) {
      lane.close();
    }
    lanes.clear();
    for (Join j : joins.values()) {
      j.close();
    }
    joins.clear();
    for (Map.Entry<AllocationKey, Opened> e : openedAllocations.entrySet()) {
      Cuda.setDevice(e.getKey().device());
      Cuda.ipcCloseMemHandle(e.getValue().base());
    }
    openedAllocations.clear();
    planBuffers.values().forEach(PlanBuffers::close); // after the lanes gave their plans back
    planBuffers.clear();
  }

  /** A device's join stream: it waits for several lanes' join events, then records. */
  private static final class Join {
    final int device;
    final long stream;
    boolean closed;

    Join(int device) {
      this.device = device;
      Cuda.setDevice(device);
      this.stream = Cuda.streamCreate();
    }

    synchronized void close() {
      if (closed) {
        return;
      }
      closed = true;
      Cuda.setDevice(device);
      Cuda.streamSynchronize(stream);
      Cuda.streamDestroy(stream);
    }
  }

  /** One peer's copy stream on one local device, with what its launches reuse. */
  private final class Lane {
    final int device;
    final long stream;
    final @Nullable CudaKernels kernels;
    final KernelArgs args = new KernelArgs(8);
    final ArrayDeque<Long> events = new ArrayDeque<>();
    /**
     * Recorded behind the lane's copies when the join stream must wait for them; recording it
     * again later is safe, as a wait binds to the record before it.
     */
    final long joinEvent;
    final PlanBuffers buffers;
    final LinkedHashMap<TransferBatch, ScatterPlan> plans = new LinkedHashMap<>(16, 0.75f, true);
    @Nullable TransferBatch lastBatch;
    @Nullable ScatterPlan lastPlan;
    @Nullable Memory dsts;
    @Nullable Memory srcs;
    @Nullable Memory sizes;
    final Memory attrs = new Memory(24);
    final Memory attrIndex = new Memory(8);
    /** Closed because its peer left: a transfer that still got hold of it fails. */
    boolean closed;
    /**
     * The status of the copies queued on the stream last (set under the lane's lock): a done
     * word stored right behind them waits for nothing else.
     */
    @Nullable TransferStatus lastQueued;

    Lane(int device) {
      this.device = device;
      Cuda.setDevice(device);
      this.stream = Cuda.streamCreate();
      this.joinEvent = Cuda.eventCreate(false);
      this.buffers =
          planBuffers.computeIfAbsent(device, d -> PlanBuffers.forDevice(d, POOLED_PLAN_BYTES));
      this.kernels = method != CopyMethod.MEMCPY_BATCH ? CudaKernels.forDevice(device) : null;
      attrs.clear();
      attrs.setInt(0, 1); // cudaMemcpySrcAccessOrderStream
      attrIndex.setLong(0, 0);
    }

    /** The batch's device plan: cached, since every layer of a request shares one. */
    ScatterPlan plan(TransferBatch batch) {
      ScatterPlan last = lastPlan;
      if (batch == lastBatch && last != null) {
        return last;
      }
      ScatterPlan plan = plans.get(batch);
      if (plan == null) {
        plan = ScatterPlan.upload(device, batch, stream, buffers);
        CopyStamps.planned();
        plans.put(batch, plan);
        if (plans.size() > PLANS_PER_LANE) {
          var eldest = plans.entrySet().iterator().next();
          plans.remove(eldest.getKey());
          retire(eldest.getValue());
        }
      }
      lastBatch = batch;
      lastPlan = plan;
      return plan;
    }

    /** Frees an evicted plan once the launches queued before now are done. */
    private void retire(ScatterPlan plan) {
      if (plan == lastPlan) {
        lastBatch = null;
        lastPlan = null;
      }
      long fence = Cuda.eventCreate(false);
      Cuda.eventRecord(fence, stream);
      poller.watchInOrder(stream, fence, () -> {
        plan.close();
        Cuda.eventDestroy(fence);
      }, e -> Cuda.eventDestroy(fence));
    }

    void memcpyBatch(TransferBatch batch, long localBase, long remoteBase, boolean toRemote) {
      int n = batch.count();
      if (n == 0) {
        return;
      }
      Memory dsts = this.dsts;
      Memory srcs = this.srcs;
      Memory sizes = this.sizes;
      if (dsts == null || srcs == null || sizes == null || dsts.size() < 8L * n) {
        dsts = this.dsts = new Memory(8L * n);
        srcs = this.srcs = new Memory(8L * n);
        sizes = this.sizes = new Memory(8L * n);
      }
      long[] lo = batch.localOffsets();
      long[] ro = batch.remoteOffsets();
      long[] sz = batch.sizes();
      for (int i = 0; i < n; i++) {
        long l = localBase + lo[i];
        long r = remoteBase + ro[i];
        dsts.setLong(8L * i, toRemote ? r : l);
        srcs.setLong(8L * i, toRemote ? l : r);
      }
      sizes.write(0, sz, 0, n);
      Cuda.memcpyBatchAsync(dsts, srcs, sizes, n, attrs, attrIndex, stream);
    }

    synchronized long takeEvent() {
      Long e = events.poll();
      return e != null ? e : Cuda.eventCreate(false);
    }

    synchronized void returnEvent(long event) {
      events.add(event);
    }

    /**
     * Queues a store of {@code value} at {@code address} behind the lane's copies if {@code
     * last}'s copies are the last queued on it; false, queueing nothing, otherwise.
     */
    synchronized boolean writeValueAfter(TransferStatus last, long address, long value) {
      return lastQueued == last && writeValue(address, value);
    }

    /**
     * Queues a store of {@code value} at {@code address} behind the lane's copies; false, queueing
     * nothing, once the lane is closed.
     */
    synchronized boolean writeValue(long address, long value) {
      if (closed) {
        return false;
      }
      Cuda.setDevice(device);
      Cuda.streamWriteValue64(stream, address, value);
      return true;
    }

    /** Waits for the lane's queued work (no-op once closed: closing waited already). */
    synchronized void drain() {
      if (!closed) {
        Cuda.setDevice(device);
        Cuda.streamSynchronize(stream);
      }
    }

    synchronized void close() {
      if (closed) {
        return;
      }
      closed = true;
      Cuda.setDevice(device);
      Cuda.streamSynchronize(stream);
      for (ScatterPlan p : plans.values()) {
        p.close();
      }
      plans.clear();
      for (Long e : events) {
        Cuda.eventDestroy(e);
      }
      events.clear();
      Cuda.eventDestroy(joinEvent);
      Cuda.streamDestroy(stream);
    }
  }
}
