package dev.kvferry.rdma;

import com.sun.jna.Pointer;
import dev.kvferry.rdma.cuda.Cuda;
import dev.kvferry.rdma.cuda.CudaException;
import dev.kvferry.rdma.cuda.CudaUnavailableException;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.channels.SocketChannel;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.locks.LockSupport;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Pinned host buffers through which {@link TcpTransport} and {@link TcpListener} move GPU memory,
 * since a socket can only read and write host memory. The bytes of a frame's entries form one
 * stream cut into chunks of one buffer each; small scattered entries are packed back to back into
 * a chunk (one {@code cudaMemcpyAsync} per run of entries adjacent on the device). With two or
 * more buffers the device copies of one chunk overlap the socket I/O of another:
 *
 * <ul>
 *   <li>send: device -> buffer copies are queued ahead for every buffer; the socket writes chunk k
 *       once its event fired, then that buffer is refilled with chunk k + depth;
 *   <li>receive: chunk k is read from the socket into its buffer once the buffer's previous
 *       buffer -> device copy is done, then copied to the device while chunk k + 1 is read.
 * </ul>
 *
 * <p>One {@link Lane} (the buffers, a stream and an event per buffer, of one device) serves one
 * transfer or listener frame at a time. Lanes are allocated on first use per device, kept for
 * reuse and freed on close, so a device holds as many lanes as transfers staged on it at once.
 * A lane goes back to the pool only after a success, with no copy in flight; after a failure it
 * is freed once its copies are done, or leaked (with a warning) when they never finish, since
 * freeing memory a copy engine may still write to is worse.
 */
final class PinnedStaging implements AutoCloseable {
  private static final Logger log = LoggerFactory.getLogger(PinnedStaging.class);
  /**
   * Spin this long on an event before parking: a chunk's copy is short (4 MiB at tens of GB/s is
   * about 100 us) and a park oversleeps by tens of microseconds, stalling the socket for nothing.
   */
  private static final long SPIN_NS = TimeUnit.MICROSECONDS.toNanos(500);
  private static final long PARK_NS = TimeUnit.MICROSECONDS.toNanos(20);

  private final int depth;
  private final int bufferBytes;
  private final long timeoutNs;
  private final Map<Integer, ArrayDeque<Lane>> idle = new HashMap<>();
  private final Set<Lane> lanes = new HashSet<>();
  private boolean closed;

  /** Staging through {@code depth} buffers of {@code bufferBytes}; a copy may take {@code timeoutNs}. */
  PinnedStaging(int depth, int bufferBytes, long timeoutNs) {
    this.depth = depth;
    this.bufferBytes = bufferBytes;
    this.timeoutNs = timeoutNs;
  }

  /** A failed CUDA call, a device copy that never finished, or no CUDA at all. */
  static final class StagingException extends IOException {
    private static final long serialVersionUID = 1L;

    StagingException(String message) {
      super(message);
    }
  }

  /**
   * An idle lane of {@code device}, allocated when there is none.
   *
   * @throws StagingException when CUDA is unavailable, allocation fails, or this is closed
   */
  Lane acquire(int device) throws StagingException {
    synchronized (this) {
      if (closed) {
        throw new StagingException("the transport is closed");
      }
      ArrayDeque<Lane> free = idle.get(device);
      Lane lane = free == null ? null : free.pollFirst();
      if (lane != null) {
        return lane;
      }
    }
    Lane lane = new Lane(device); // outside the lock: pinning memory takes a while
    synchronized (this) {
      if (!closed) {
        lanes.add(lane);
        return lane;
      }
    }
    lane.free();
    throw new StagingException("the transport is closed");
  }

  /** Returns a lane after use; one that failed (or any once closed) is freed instead. */
  void release(Lane lane) {
    synchronized (this) {
      if (!closed && !lane.broken) {
        idle.computeIfAbsent(lane.device, d -> new ArrayDeque<>()).offerFirst(lane);
        return;
      }
      lanes.remove(lane);
    }
    if (lane.unsettled) {
      log.warn(
          "leaking {} pinned buffers of {} bytes of GPU {}: their copies did not finish",
          depth, bufferBytes, lane.device);
    } else {
      lane.free();
    }
  }

  /** Frees the idle lanes now; lanes in use are freed when released. */
  @Override
  public void close() {
    List<Lane> toFree = new ArrayList<>();
    synchronized (this) {
      closed = true;
      for (ArrayDeque<Lane> free : idle.values()) {
        toFree.addAll(free);
      }
      idle.clear();
      lanes.removeAll(toFree);
    }
    for (Lane lane : toFree) {
      lane.free();
    }
  }

  /** Lanes allocated and not yet freed (idle or in use). */
  synchronized int laneCount() {
    return lanes.size();
  }

  /** The pinned buffers, stream and events of one device; used by one thread at a time. */
  final class Lane {
    final int device;
    private final long stream;
    private final long[] hostAddresses = new long[depth];
    private final long[] events = new long[depth];
    private final ByteBuffer[] views = new ByteBuffer[depth];
    private final int[] chunkBytes = new int[depth];
    /** A transfer failed on this lane: not reused. */
    private boolean broken;
    /** Copies of the failed transfer may still be running: the buffers are never freed. */
    private boolean unsettled;
    private final EntryCursor cursor = new EntryCursor();
    private long deviceBase;
    private long total;
    private long staged;

    private Lane(int device) throws StagingException {
      this.device = device;
      long s = 0;
      try {
        Cuda.setDevice(device);
        s = Cuda.streamCreate();
        for (int b = 0; b < depth; b++) {
          hostAddresses[b] = Cuda.hostAlloc(bufferBytes);
          views[b] = new Pointer(hostAddresses[b]).getByteBuffer(0, bufferBytes);
          events[b] = Cuda.eventCreate(false);
        }
      } catch (CudaException | CudaUnavailableException e) {
        releaseNative(s);
        throw new StagingException(
            "cannot set up " + depth + " pinned buffers of " + bufferBytes + " bytes for GPU "
                + device + ": " + e.getMessage());
      }
      this.stream = s;
    }

    /**
     * Starts sending {@code count} entries of device memory at {@code deviceBase} (ranges checked
     * by the caller): queues the copies of the first chunks and waits for the first, so a CUDA
     * failure shows before any byte or ack goes out. Then call {@link #finishSend}.
     */
    void startSend(long deviceBase, long[] offsets, long[] lengths, int count)
        throws StagingException {
      total = begin(deviceBase, offsets, lengths, count);
      staged = 0;
      boolean started = false;
      try {
        for (int b = 0; b < depth && staged < total; b++) {
          staged += stage(b, (int) Math.min(bufferBytes, total - staged), false);
        }
        await(0);
        started = true;
      } catch (CudaException e) {
        throw failed(e);
      } finally {
        if (!started) {
          settle();
        }
      }
    }

    /** Writes the bytes started by {@link #startSend} to the channel, staging the rest. */
    void finishSend(SocketChannel channel, TcpWire.Progress progress) throws IOException {
      boolean settled = false;
      try {
        long sent = 0;
        for (int b = 0; sent < total; b = (b + 1) % depth) {
          await(b);
          TcpWire.writeFully(channel, views[b].clear().limit(chunkBytes[b]), progress);
          sent += chunkBytes[b];
          if (staged < total) {
            staged += stage(b, (int) Math.min(bufferBytes, total - staged), false);
          }
        }
        settled = true;
      } catch (CudaException e) {
        throw failed(e);
      } finally {
        if (!settled) {
          settle();
        }
      }
    }

    /**
     * Receives the bytes of {@code count} entries from the channel into device memory at {@code
     * deviceBase} (ranges checked by the caller); returns once every byte is on the device.
     */
    void receive(
        SocketChannel channel, long deviceBase, long[] offsets, long[] lengths, int count,
        TcpWire.Progress progress) throws IOException {
      total = begin(deviceBase, offsets, lengths, count);
      boolean settled = false;
      try {
        long received = 0;
        for (int b = 0; received < total; b = (b + 1) % depth) {
          await(b); // the buffer's previous copy to the device is done
          int chunk = (int) Math.min(bufferBytes, total - received);
          ByteBuffer view = views[b].clear().limit(chunk);
          while (view.hasRemaining()) {
            if (channel.read(view) < 0) {
              throw new TcpWire.TruncatedException(
                  "truncated payload: connection closed after " + (received + view.position())
                      + " of " + total + " bytes");
            }
            progress.progressed();
          }
          stage(b, chunk, true);
          received += chunk;
        }
        for (int b = 0; b < depth; b++) {
          await(b);
        }
        settled = true;
      } catch (CudaException e) {
        throw failed(e);
      } finally {
        if (!settled) {
          settle();
        }
      }
    }

    private long begin(long deviceBase, long[] offsets, long[] lengths, int count)
        throws StagingException {
      try {
        Cuda.setDevice(device);
      } catch (CudaException e) {
        throw failed(e);
      }
      this.deviceBase = deviceBase;
      return cursor.reset(offsets, lengths, count);
    }

    /**
     * Queues the copies of the next {@code chunk} bytes of the entries between the device and
     * buffer {@code b} (one per run adjacent on the device), then records the buffer's event.
     */
    private int stage(int b, int chunk, boolean toDevice) {
      long host = hostAddresses[b];
      long at = 0;
      while (at < chunk) {
        long run = cursor.nextRun(chunk - at);
        long dev = deviceBase + cursor.runOffset();
        if (toDevice) {
          Cuda.memcpyAsync(dev, host + at, run, stream);
        } else {
          Cuda.memcpyAsync(host + at, dev, run, stream);
        }
        at += run;
      }
      Cuda.eventRecord(events[b], stream);
      chunkBytes[b] = chunk;
      return chunk;
    }

    /** Waits for buffer {@code b}'s last recorded copies, polling (no thread blocks in CUDA). */
    private void await(int b) throws StagingException {
      long event = events[b];
      if (Cuda.eventQuery(event)) {
        return;
      }
      long start = System.nanoTime();
      while (!Cuda.eventQuery(event)) {
        long waited = System.nanoTime() - start;
        if (waited > timeoutNs) {
          unsettled = true;
          throw new StagingException(
              "GPU " + device + ": a copy through pinned host memory did not finish within "
                  + TimeUnit.NANOSECONDS.toMillis(timeoutNs) + " ms");
        }
        if (waited < SPIN_NS) {
          Thread.onSpinWait();
        } else {
          LockSupport.parkNanos(PARK_NS);
        }
      }
    }

    /**
     * After a failure: waits for the copies still in flight, so none lands in the region after
     * the transfer has failed and none uses a buffer after it is freed.
     */
    private void settle() {
      broken = true;
      if (unsettled) {
        return; // a copy already timed out: waiting again would only delay the failure
      }
      try {
        // Recorded now, buffer 0's event completes after every copy queued so far, also one that
        // a failure left without an event of its own.
        Cuda.eventRecord(events[0], stream);
        for (int b = 0; b < depth; b++) {
          await(b);
        }
      } catch (StagingException | CudaException e) {
        unsettled = true;
      }
    }

    /** A READ whose ack could not go out: its staged copies may still run; settle them. */
    void abandonSend() {
      settle();
    }

    private StagingException failed(CudaException e) {
      return new StagingException("GPU " + device + " via pinned host buffers: " + e.getMessage());
    }

    private void free() {
      releaseNative(stream);
    }

    /** Frees what was allocated; CUDA errors are ignored (nothing else could be done with them). */
    private void releaseNative(long s) {
      for (int b = 0; b < depth; b++) {
        long event = events[b];
        if (event != 0) {
          ignoreErrors(() -> Cuda.eventDestroy(event));
          events[b] = 0;
        }
        if (hostAddresses[b] != 0) {
          long host = hostAddresses[b];
          ignoreErrors(() -> Cuda.freeHost(host));
          hostAddresses[b] = 0;
          views[b] = null;
        }
      }
      if (s != 0) {
        ignoreErrors(() -> Cuda.streamDestroy(s));
      }
    }
  }

  /**
   * Walks a frame's entries in order as runs of bytes adjacent in the region, so a chunk needs one
   * copy per run rather than per entry (blocks that are neighbours on this side merge).
   */
  static final class EntryCursor {
    private long[] offsets = NO_ENTRIES;
    private long[] lengths = NO_ENTRIES;
    private static final long[] NO_ENTRIES = new long[0];
    private int count;
    private int entry;
    private long entryDone;
    private long runOffset;

    /** Starts at the first byte of {@code count} entries; returns their total bytes. */
    long reset(long[] offsets, long[] lengths, int count) {
      this.offsets = offsets;
      this.lengths = lengths;
      this.count = count;
      this.entry = 0;
      this.entryDone = 0;
      long total = 0;
      for (int i = 0; i < count; i++) {
        total += lengths[i];
      }
      skipEmpty();
      return total;
    }

    /**
     * Advances over the next run of at most {@code maxBytes} (positive, and no more than remain)
     * and returns its length; {@link #runOffset()} is where it starts in the region.
     */
    long nextRun(long maxBytes) {
      runOffset = offsets[entry] + entryDone;
      long run = 0;
      while (true) {
        long piece = Math.min(lengths[entry] - entryDone, maxBytes - run);
        run += piece;
        entryDone += piece;
        if (entryDone < lengths[entry]) {
          return run;
        }
        entry++;
        entryDone = 0;
        skipEmpty();
        if (run == maxBytes || entry == count || offsets[entry] != runOffset + run) {
          return run;
        }
      }
    }

    long runOffset() {
      return runOffset;
    }

    private void skipEmpty() {
      while (entry < count && lengths[entry] == 0) {
        entry++;
      }
    }
  }

  private static void ignoreErrors(Runnable call) {
    try {
      call.run();
    } catch (CudaException | CudaUnavailableException e) {
      // freeing after a failure: the context may be gone already
    }
  }
}
