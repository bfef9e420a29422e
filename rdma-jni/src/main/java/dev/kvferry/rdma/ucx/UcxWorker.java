package dev.kvferry.rdma.ucx;

import com.sun.jna.CallbackReference;
import com.sun.jna.LastErrorException;
import com.sun.jna.Memory;
import com.sun.jna.Pointer;
import dev.kvferry.rdma.TransferStatus;
import java.nio.ByteBuffer;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.Iterator;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicInteger;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;
import org.jspecify.annotations.Nullable;

/**
 * One UCP context and worker, owned by one progress thread: every UCX call but {@code
 * ucp_worker_signal} runs on that thread (the worker is opened in single-thread mode, so UCX takes
 * no locks). Other threads hand it work through a queue and wake it with {@code
 * ucp_worker_signal}. With nothing to do the thread arms the worker and sleeps in {@code poll} on
 * the worker's event fd: no spinning.
 *
 * <p>A batch is one {@code ucp_put_nbx} or {@code ucp_get_nbx} per block on the peer's endpoint and
 * then one {@code ucp_ep_flush_nbx}; the batch is done when the flush is. Endpoints (one per peer
 * worker address) and unpacked remote keys are cached. An endpoint error (the peer died or its
 * connection broke) fails every batch in flight on it and drops the endpoint, so the next batch to
 * that peer opens a fresh one. A batch whose flush makes no progress for the I/O timeout fails and
 * force-closes its endpoint.
 */
public final class UcxWorker implements AutoCloseable {
  private static final Logger log = LoggerFactory.getLogger(UcxWorker.class);

  /** The API version kvferry's struct layouts come from (see {@link Ucp}). */
  private static final int API_MAJOR = 1;
  private static final int API_MINOR = 10;

  private static final long CALL_TIMEOUT_SECONDS = 30;

  /**
   * How often a batch on an endpoint without peer-failure handling (shared memory in UCX 1.13)
   * checks that the peer process lives: only while such a batch is in flight.
   */
  private static final long LIVENESS_PERIOD_NS = TimeUnit.MILLISECONDS.toNanos(100);

  private final String name;
  private final long ioTimeoutNs;
  private final long context;
  private final long worker;
  private final byte[] address;
  private final int eventFd;
  private final Thread thread;
  private final ConcurrentLinkedQueue<Runnable> commands = new ConcurrentLinkedQueue<>();
  private final AtomicBoolean closing = new AtomicBoolean();
  /**
   * Threads between their check of {@link #closing} and their {@code ucp_worker_signal}: the
   * progress thread destroys the worker only once none is left, so no signal reaches freed memory.
   */
  private final AtomicInteger signalling = new AtomicInteger();

  // Owned by the progress thread.
  private final Map<ByteBuffer, Peer> peers = new HashMap<>();
  private final Map<Long, Peer> peersById = new HashMap<>();
  private final List<Batch> inFlight = new ArrayList<>();
  private final List<Peer> failedPeers = new ArrayList<>();
  private long nextPeerId = 1;
  private long livenessCheckDueNs;
  /** A zeroed ucp_request_param_t: no callback, the call may complete at once. */
  private final Memory noCallback = zeroed(Ucp.REQUEST_PARAM_BYTES);
  private final long noCallbackAddress = Pointer.nativeValue(noCallback);
  private final Memory closeForce = zeroed(Ucp.REQUEST_PARAM_BYTES);
  private final Memory pollFd = zeroed(8);
  /** Held here so the JNA callback is not collected while UCX may call it. */
  private final Ucp.ErrorHandler errorHandler = this::onEndpointError;

  /** A mapped region: the handle for ucp_mem_unmap and the packed remote key peers need. */
  public record Mapping(long memh, byte[] packedRkey) {}

  /**
   * Opens a context and worker and starts the progress thread.
   *
   * @param name for the thread and error messages
   * @param transports UCX_TLS for this context (e.g. {@code tcp}, {@code sm}, {@code rc,sm});
   *     empty leaves UCX's own choice (the environment's UCX_TLS, else every transport)
   * @param ioTimeoutNs a batch whose flush does not complete within this fails
   * @throws UcxUnavailableException without a usable libucp
   * @throws UcxException naming the call that failed
   */
  public UcxWorker(String name, String transports, long ioTimeoutNs) {
    Ucx.require();
    this.name = name;
    this.ioTimeoutNs = ioTimeoutNs;
    closeForce.setInt(0, Ucp.OP_ATTR_FIELD_FLAGS);
    closeForce.setInt(4, Ucp.EP_CLOSE_FLAG_FORCE);
    long[] out = new long[1];
    Ucx.check(Ucp.ucp_config_read(null, null, out), "ucp_config_read");
    long config = out[0];
    long ctx;
    try {
      if (!transports.isEmpty()) {
        Ucx.check(Ucp.ucp_config_modify(config, "TLS", transports), "ucp_config_modify(TLS=" + transports + ")");
      }
      Memory params = zeroed(Ucp.PARAMS_BYTES);
      params.setLong(0, Ucp.PARAM_FIELD_FEATURES);
      params.setLong(8, Ucp.FEATURE_RMA | Ucp.FEATURE_WAKEUP);
      Ucx.check(
          Ucp.ucp_init_version(API_MAJOR, API_MINOR, Pointer.nativeValue(params), config, out),
          "ucp_init");
      ctx = out[0];
    } finally {
      Ucp.ucp_config_release(config);
    }
    this.context = ctx;
    try {
      Memory wp = zeroed(Ucp.WORKER_PARAMS_BYTES);
      wp.setLong(0, Ucp.WORKER_PARAM_FIELD_THREAD_MODE);
      wp.setInt(8, Ucp.THREAD_MODE_SINGLE);
      Ucx.check(Ucp.ucp_worker_create(context, Pointer.nativeValue(wp), out), "ucp_worker_create");
      this.worker = out[0];
    } catch (UcxException e) {
      Ucp.ucp_cleanup(context);
      throw e;
    }
    try {
      long[] length = new long[1];
      Ucx.check(Ucp.ucp_worker_get_address(worker, out, length), "ucp_worker_get_address");
      this.address = new Pointer(out[0]).getByteArray(0, (int) length[0]);
      Ucp.ucp_worker_release_address(worker, out[0]);
      int[] fd = new int[1];
      Ucx.check(Ucp.ucp_worker_get_efd(worker, fd), "ucp_worker_get_efd");
      this.eventFd = fd[0];
    } catch (UcxException e) {
      Ucp.ucp_worker_destroy(worker);
      Ucp.ucp_cleanup(context);
      throw e;
    }
    pollFd.setInt(0, eventFd);
    pollFd.setShort(4, LibPoll.POLLIN);
    this.thread = new Thread(this::run, "kvferry-ucx-progress-" + name);
    thread.setDaemon(true);
    thread.start();
  }

  /** This worker's address: what a peer needs to open an endpoint to it. */
  public byte[] address() {
    return address.clone();
  }

  /**
   * Maps {@code [address, address + lengthBytes)} with ucp_mem_map and packs its remote key.
   *
   * @throws UcxException naming the call that failed
   */
  public Mapping map(long address, long lengthBytes) {
    return call(() -> packed(memMap(address, lengthBytes, 0)), "ucp_mem_map");
  }

  /**
   * Memory UCX allocates itself and maps ({@code UCP_MEM_MAP_ALLOCATE}): on one host UCX places it
   * in shared memory whose remote key lets a peer map it and put with a plain memcpy, which it
   * cannot do into memory the process allocated (there puts become cma system calls). Freed by
   * {@link #unmap}, or with the context when the worker closes.
   *
   * @throws UcxException naming the call that failed
   */
  public Allocation allocate(long lengthBytes) {
    return call(
        () -> {
          long memh = memMap(0, lengthBytes, Ucp.MEM_MAP_ALLOCATE);
          Memory attr = zeroed(Ucp.MEM_ATTR_BYTES);
          attr.setLong(0, Ucp.MEM_ATTR_FIELD_ADDRESS | Ucp.MEM_ATTR_FIELD_LENGTH);
          int status = Ucp.ucp_mem_query(memh, Pointer.nativeValue(attr));
          if (status != Ucp.UCS_OK) {
            Ucp.ucp_mem_unmap(context, memh);
            Ucx.check(status, "ucp_mem_query");
          }
          long length = attr.getLong(16);
          if (length < lengthBytes) {
            Ucp.ucp_mem_unmap(context, memh);
            throw new IllegalStateException("ucp_mem_map(ALLOCATE) of " + lengthBytes
                + " bytes gave " + length);
          }
          return new Allocation(packed(memh), attr.getLong(8), length);
        },
        "ucp_mem_map(ALLOCATE)");
  }

  /** Memory UCX allocated: its mapping, and where it lies in this process. */
  public record Allocation(Mapping mapping, long address, long lengthBytes) {}

  /** ucp_mem_map on the progress thread; the handle. */
  private long memMap(long address, long lengthBytes, int flags) {
    Memory p = zeroed(Ucp.MEM_MAP_PARAMS_BYTES);
    p.setLong(0, Ucp.MEM_MAP_PARAM_FIELD_ADDRESS | Ucp.MEM_MAP_PARAM_FIELD_LENGTH
        | (flags != 0 ? Ucp.MEM_MAP_PARAM_FIELD_FLAGS : 0));
    p.setLong(8, address);
    p.setLong(16, lengthBytes);
    p.setInt(24, flags);
    long[] memh = new long[1];
    Ucx.check(Ucp.ucp_mem_map(context, Pointer.nativeValue(p), memh), "ucp_mem_map");
    return memh[0];
  }

  /** The mapping with its packed remote key; unmaps it when packing fails. */
  private Mapping packed(long memh) {
    long[] buffer = new long[1];
    long[] size = new long[1];
    int status = Ucp.ucp_rkey_pack(context, memh, buffer, size);
    if (status != Ucp.UCS_OK) {
      Ucp.ucp_mem_unmap(context, memh);
      Ucx.check(status, "ucp_rkey_pack");
    }
    byte[] rkey = new Pointer(buffer[0]).getByteArray(0, (int) size[0]);
    Ucp.ucp_rkey_buffer_release(buffer[0]);
    return new Mapping(memh, rkey);
  }

  /** Unmaps a region mapped by {@link #map}; peers' keys to it stop working. */
  public void unmap(Mapping mapping) {
    call(
        () -> {
          Ucx.check(Ucp.ucp_mem_unmap(context, mapping.memh()), "ucp_mem_unmap");
          return Boolean.TRUE;
        },
        "ucp_mem_unmap");
  }

  /**
   * Starts one batch: {@code sizes[i]} bytes between {@code localAddress + localOffsets[i]} and
   * {@code remoteAddress + remoteOffsets[i]} of the peer at {@code peerAddress}, reached with
   * {@code packedRkey}. Bounds must be checked already. {@code status} completes when the flush
   * does; {@code release} runs after, once UCX no longer touches the local memory.
   *
   * @param peerName names the peer in failure messages ("region 3 of D0")
   * @param peerPid the peer's process id when it runs on this host, else 0: watched for endpoints
   *     whose transports cannot report a peer's failure
   */
  public void submit(
      boolean put,
      byte[] peerAddress,
      byte[] packedRkey,
      long localAddress,
      long remoteAddress,
      long[] localOffsets,
      long[] remoteOffsets,
      long[] sizes,
      String peerName,
      long peerPid,
      TransferStatus status,
      Runnable release) {
    Batch b = new Batch(put, peerAddress, packedRkey, localAddress, remoteAddress, localOffsets,
        remoteOffsets, sizes, peerName, peerPid, status, release);
    Runnable command = () -> start(b);
    signalling.incrementAndGet();
    try {
      if (closing.get()) {
        b.finish("ucx transport is closed");
        return;
      }
      commands.add(command);
      wake();
    } finally {
      signalling.decrementAndGet();
    }
    if (closing.get() && commands.remove(command)) {
      // The progress thread may be gone: nobody else will run it.
      b.finish("ucx transport is closed");
    }
  }

  /** Stops the progress thread: batches in flight fail, endpoints close, the worker and context go. */
  @Override
  public void close() {
    signalling.incrementAndGet();
    try {
      if (!closing.compareAndSet(false, true)) {
        return;
      }
      wake();
    } finally {
      signalling.decrementAndGet();
    }
    try {
      thread.join(TimeUnit.SECONDS.toMillis(CALL_TIMEOUT_SECONDS));
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
    }
  }

  private void wake() {
    int status = Ucp.ucp_worker_signal(worker);
    if (status != Ucp.UCS_OK) {
      // The thread still wakes at the next deadline; a failure here is a bug worth seeing.
      log.error("ucp_worker_signal failed: {}", Ucx.statusText(status));
    }
  }

  private interface Call<T> {
    T run();
  }

  /** Runs {@code work} on the progress thread and waits for its result. */
  private <T> T call(Call<T> work, String what) {
    CompletableFuture<T> result = new CompletableFuture<>();
    signalling.incrementAndGet();
    try {
      if (closing.get()) {
        throw new IllegalStateException("ucx worker " + name + " is closed");
      }
      commands.add(
          () -> {
            try {
              result.complete(work.run());
            } catch (RuntimeException e) {
              result.completeExceptionally(e);
            }
          });
      wake();
    } finally {
      signalling.decrementAndGet();
    }
    try {
      return result.get(CALL_TIMEOUT_SECONDS, TimeUnit.SECONDS);
    } catch (ExecutionException e) {
      if (e.getCause() instanceof RuntimeException r) {
        throw r;
      }
      throw new IllegalStateException(what, e.getCause());
    } catch (TimeoutException e) {
      throw new IllegalStateException(what + " on ucx worker " + name + " did not run within "
          + CALL_TIMEOUT_SECONDS + " s (is it closed?)", e);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw new IllegalStateException("interrupted during " + what, e);
    }
  }

  // ---- the progress thread ----

  private void run() {
    try {
      while (!closing.get()) {
        Runnable command;
        while ((command = commands.poll()) != null) {
          command.run();
        }
        while (Ucp.ucp_worker_progress(worker) != 0) {
          // drain every completion before looking at the requests
        }
        dropFailedPeers();
        long nowNs = System.nanoTime();
        long nextDeadlineNs = checkInFlight(nowNs);
        if (!commands.isEmpty()) {
          continue;
        }
        int armed = Ucp.ucp_worker_arm(worker);
        if (armed == Ucp.UCS_ERR_BUSY) {
          continue; // events arrived since the progress above
        }
        Ucx.check(armed, "ucp_worker_arm");
        int timeoutMs =
            nextDeadlineNs == Long.MAX_VALUE
                ? -1
                : (int) Math.max(1, TimeUnit.NANOSECONDS.toMillis(nextDeadlineNs - nowNs) + 1);
        try {
          LibPoll.poll(Pointer.nativeValue(pollFd), 1, timeoutMs);
        } catch (LastErrorException e) {
          if (e.getErrorCode() != LibPoll.EINTR) {
            throw e;
          }
        }
      }
    } catch (RuntimeException | Error e) {
      log.error("ucx progress thread {} stopped", name, e);
      closing.set(true);
    } finally {
      shutdown();
    }
  }

  private void start(Batch b) {
    if (closing.get()) {
      b.finish("ucx transport is closed");
      return;
    }
    Peer peer;
    long rkey;
    try {
      peer = peer(b.peerAddress);
      rkey = peer.rkey(b.packedRkey);
    } catch (UcxException e) {
      b.finish("ucx: cannot reach " + b.peerName + ": " + e.getMessage() + "; nothing was moved");
      return;
    }
    long[] lo = b.localOffsets;
    long[] ro = b.remoteOffsets;
    long[] sz = b.sizes;
    for (int i = 0; i < sz.length; i++) {
      if (sz[i] == 0) {
        continue;
      }
      long request =
          b.put
              ? Ucp.ucp_put_nbx(peer.ep, b.localAddress + lo[i], sz[i], b.remoteAddress + ro[i], rkey,
                  noCallbackAddress)
              : Ucp.ucp_get_nbx(peer.ep, b.localAddress + lo[i], sz[i], b.remoteAddress + ro[i], rkey,
                  noCallbackAddress);
      if (Ucp.isError(request)) {
        // Earlier blocks may be on the wire: flush them before the memory is released.
        b.failure = (b.put ? "ucp_put_nbx" : "ucp_get_nbx") + " of block " + i + " failed: "
            + Ucx.statusText((int) request);
        break;
      }
      if (request != 0) {
        // Completion is covered by the flush below; UCX frees the request when it is done.
        Ucp.ucp_request_free(request);
      }
    }
    long flush = Ucp.ucp_ep_flush_nbx(peer.ep, noCallbackAddress);
    if (flush == 0) {
      complete(b, Ucp.UCS_OK);
    } else if (Ucp.isError(flush)) {
      complete(b, (int) flush);
    } else {
      b.flushRequest = flush;
      b.peer = peer;
      b.deadlineNs = System.nanoTime() + ioTimeoutNs;
      inFlight.add(b);
    }
  }

  private void complete(Batch b, int status) {
    if (b.failure != null) {
      b.finish("ucx " + b.verb() + " " + b.peerName + " failed: " + b.failure);
    } else if (status == Ucp.UCS_OK) {
      b.succeed();
    } else {
      b.finish("ucx " + b.verb() + " " + b.peerName + " failed: ucp_ep_flush_nbx: "
          + Ucx.statusText(status) + " (the peer died or its connection broke)");
    }
  }

  /**
   * Completes the batches whose flush is done, fails those past their deadline or whose peer
   * process is gone; returns when to look again (Long.MAX_VALUE: only when woken).
   */
  private long checkInFlight(long nowNs) {
    long next = Long.MAX_VALUE;
    boolean livenessDue = nowNs - livenessCheckDueNs >= 0;
    boolean watching = false;
    for (Iterator<Batch> it = inFlight.iterator(); it.hasNext(); ) {
      Batch b = it.next();
      int status = Ucp.ucp_request_check_status(b.flushRequest);
      if (status != Ucp.UCS_INPROGRESS) {
        Ucp.ucp_request_free(b.flushRequest);
        it.remove();
        complete(b, status);
        continue;
      }
      if (b.abandoned) {
        continue; // failed already; released once UCX completes the flush
      }
      if (nowNs - b.deadlineNs >= 0) {
        abandon(b, "made no progress for " + TimeUnit.NANOSECONDS.toMillis(ioTimeoutNs) + " ms",
            "timed out");
        continue;
      }
      Peer peer = b.peer;
      if (peer != null && !peer.errorHandling && b.peerPid > 0) {
        watching = true;
        if (livenessDue && !ProcessHandle.of(b.peerPid).map(ProcessHandle::isAlive).orElse(false)) {
          abandon(b, "failed: its process " + b.peerPid + " is gone", "process gone");
          continue;
        }
      }
      next = Math.min(next, b.deadlineNs);
    }
    if (livenessDue) {
      livenessCheckDueNs = nowNs + LIVENESS_PERIOD_NS;
    }
    return watching ? Math.min(next, livenessCheckDueNs) : next;
  }

  /** Fails a batch in flight and force-closes its endpoint, which completes its flush with an error. */
  private void abandon(Batch b, String outcome, String endpointFailure) {
    b.abandoned = true;
    b.status.fail("ucx " + b.verb() + " " + b.peerName + " " + outcome + "; its endpoint is closed");
    Peer peer = b.peer;
    if (peer != null) {
      fail(peer, endpointFailure);
    }
  }

  private Peer peer(byte[] peerAddress) {
    ByteBuffer key = ByteBuffer.wrap(peerAddress);
    Peer peer = peers.get(key);
    if (peer != null) {
      return peer;
    }
    long id = nextPeerId++;
    Memory remote = new Memory(peerAddress.length);
    remote.write(0, peerAddress, 0, peerAddress.length);
    Memory p = zeroed(Ucp.EP_PARAMS_BYTES);
    p.setLong(0, Ucp.EP_PARAM_FIELD_REMOTE_ADDRESS | Ucp.EP_PARAM_FIELD_ERR_HANDLING_MODE
        | Ucp.EP_PARAM_FIELD_ERR_HANDLER);
    p.setPointer(8, remote);
    p.setInt(16, Ucp.ERR_HANDLING_MODE_PEER);
    p.setPointer(24, CallbackReference.getFunctionPointer(errorHandler));
    p.setLong(32, id);
    long[] ep = new long[1];
    // Quiet: UCX logs an ERROR when the peer's transports cannot report failures (handled below).
    int status = Ucx.quietly(() -> Ucp.ucp_ep_create(worker, Pointer.nativeValue(p), ep));
    boolean errorHandling = true;
    if (status == Ucp.UCS_ERR_UNREACHABLE) {
      // UCX 1.13's shared-memory transports cannot report a peer's failure, and UCX refuses
      // them for an endpoint that asks for it: open one without; the I/O timeout covers it.
      p.setLong(0, Ucp.EP_PARAM_FIELD_REMOTE_ADDRESS);
      status = Ucp.ucp_ep_create(worker, Pointer.nativeValue(p), ep);
      errorHandling = false;
    }
    Ucx.check(status, "ucp_ep_create");
    if (!errorHandling) {
      log.info("ucx worker {}: endpoint {} opened without peer-failure handling (its transports "
          + "cannot report one); batches on it watch the peer's process instead", name, id);
    }
    peer = new Peer(id, key, ep[0], errorHandling);
    peers.put(key, peer);
    peersById.put(id, peer);
    return peer;
  }

  /** UCX calls this from ucp_worker_progress, on the progress thread, when an endpoint fails. */
  private void onEndpointError(Pointer arg, Pointer ep, int status) {
    Peer peer = peersById.get(Pointer.nativeValue(arg));
    if (peer != null && peer.failure == null) {
      peer.failure = Ucx.statusText(status);
      failedPeers.add(peer);
    }
  }

  private void fail(Peer peer, String why) {
    if (peer.failure == null) {
      peer.failure = why;
      failedPeers.add(peer);
    }
    dropFailedPeers();
  }

  /** Closes the endpoints that failed: their batches in flight complete with an error. */
  private void dropFailedPeers() {
    for (Peer peer : failedPeers) {
      if (!closing.get()) {
        log.warn("ucx endpoint {} of worker {} failed: {}; closing it", peer.id, name, peer.failure);
      }
      peers.remove(peer.key);
      peersById.remove(peer.id);
      peer.close();
    }
    failedPeers.clear();
  }

  private void shutdown() {
    for (Runnable command; (command = commands.poll()) != null; ) {
      command.run(); // batches fail at once (closing); a mapping call still gets its answer
    }
    for (Peer peer : new ArrayList<>(peers.values())) {
      peer.failure = "ucx transport closed";
      failedPeers.add(peer);
    }
    dropFailedPeers();
    long deadlineNs = System.nanoTime() + TimeUnit.SECONDS.toNanos(5);
    while (!inFlight.isEmpty() && System.nanoTime() - deadlineNs < 0) {
      Ucp.ucp_worker_progress(worker);
      checkInFlight(System.nanoTime());
    }
    for (Batch b : inFlight) {
      // UCX never finished them: fail, and keep their memory pinned (never released) to be safe.
      b.status.fail("ucx transport closed with the " + b.verb() + " " + b.peerName + " in flight");
    }
    inFlight.clear();
    while (signalling.get() != 0) {
      Thread.onSpinWait(); // a signaller is between its check and ucp_worker_signal: microseconds
    }
    for (Runnable command; (command = commands.poll()) != null; ) {
      command.run(); // queued after the first drain: batches fail, mapping calls get their answer
    }
    Ucp.ucp_worker_destroy(worker);
    Ucp.ucp_cleanup(context);
  }

  private static Memory zeroed(int bytes) {
    Memory m = new Memory(bytes);
    m.clear();
    return m;
  }

  /** An endpoint to one peer worker and the remote keys unpacked on it. */
  private final class Peer {
    final long id;
    final ByteBuffer key;
    final long ep;
    /** Whether UCX reports this peer's failure (else the liveness check watches its process). */
    final boolean errorHandling;
    final Map<ByteBuffer, Long> rkeys = new HashMap<>();
    @Nullable String failure;

    Peer(long id, ByteBuffer key, long ep, boolean errorHandling) {
      this.id = id;
      this.key = key;
      this.ep = ep;
      this.errorHandling = errorHandling;
    }

    long rkey(byte[] packed) {
      ByteBuffer k = ByteBuffer.wrap(packed);
      Long rkey = rkeys.get(k);
      if (rkey != null) {
        return rkey;
      }
      Memory buffer = new Memory(Math.max(1, packed.length));
      buffer.write(0, packed, 0, packed.length);
      long[] out = new long[1];
      Ucx.check(Ucp.ucp_ep_rkey_unpack(ep, Pointer.nativeValue(buffer), out), "ucp_ep_rkey_unpack");
      rkeys.put(k, out[0]);
      return out[0];
    }

    void close() {
      for (long rkey : rkeys.values()) {
        Ucp.ucp_rkey_destroy(rkey);
      }
      rkeys.clear();
      long request = Ucp.ucp_ep_close_nbx(ep, Pointer.nativeValue(closeForce));
      if (Ucp.isError(request)) {
        log.debug("ucp_ep_close_nbx of endpoint {}: {}", id, Ucx.statusText((int) request));
      } else if (request != 0) {
        Ucp.ucp_request_free(request);
      }
    }
  }

  /** One batch handed to the progress thread. */
  private static final class Batch {
    final boolean put;
    final byte[] peerAddress;
    final byte[] packedRkey;
    final long localAddress;
    final long remoteAddress;
    final long[] localOffsets;
    final long[] remoteOffsets;
    final long[] sizes;
    final String peerName;
    final TransferStatus status;
    final Runnable release;
    long flushRequest;
    @Nullable Peer peer;
    final long peerPid;
    long deadlineNs;
    boolean abandoned;
    @Nullable String failure;
    private boolean released;

    Batch(boolean put, byte[] peerAddress, byte[] packedRkey, long localAddress, long remoteAddress,
        long[] localOffsets, long[] remoteOffsets, long[] sizes, String peerName, long peerPid,
        TransferStatus status, Runnable release) {
      this.peerPid = peerPid;
      this.put = put;
      this.peerAddress = peerAddress;
      this.packedRkey = packedRkey;
      this.localAddress = localAddress;
      this.remoteAddress = remoteAddress;
      this.localOffsets = localOffsets;
      this.remoteOffsets = remoteOffsets;
      this.sizes = sizes;
      this.peerName = peerName;
      this.status = status;
      this.release = release;
    }

    String verb() {
      return put ? "write to" : "read from";
    }

    void succeed() {
      long total = 0;
      for (long s : sizes) {
        total += s;
      }
      status.succeed(total);
      releaseOnce();
    }

    void finish(String failure) {
      status.fail(failure);
      releaseOnce();
    }

    private void releaseOnce() {
      if (!released) {
        released = true;
        release.run();
      }
    }
  }
}
