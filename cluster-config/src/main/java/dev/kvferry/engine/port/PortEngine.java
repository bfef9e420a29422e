package dev.kvferry.engine.port;

import dev.kvferry.actors.connector.ConnectorMetadata;
import dev.kvferry.actors.connector.ConnectorRequest;
import dev.kvferry.actors.connector.ConnectorScheduler;
import dev.kvferry.actors.connector.ConnectorWorker;
import dev.kvferry.actors.connector.Role;
import dev.kvferry.actors.connector.TransferMode;
import dev.kvferry.actors.engine.EngineIdentity;
import dev.kvferry.actors.plan.KvCacheGeometry;
import dev.kvferry.engine.HttpEndpoint;
import dev.kvferry.rdma.MemoryRegion;
import dev.kvferry.rdma.RegionRegistry;
import dev.kvferry.rdma.cuda.Cuda;
import dev.kvferry.rdma.cuda.CudaEvent;
import dev.kvferry.rdma.cuda.CudaException;
import java.io.IOException;
import java.net.URI;
import java.time.Clock;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Objects;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import java.util.function.BooleanSupplier;
import java.util.function.Supplier;
import org.apache.pekko.actor.typed.ActorRef;
import org.jspecify.annotations.Nullable;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * One engine attached through the port: its scheduler connection, one worker per TP rank with the
 * engine's memory mapped, the requests the scheduler named and the metadata of recent steps. It
 * lives from the first hello until any of its connections closes; then its workers stop (their
 * transfers fail at the peers, which free their blocks) and the engine's memory is unmapped once
 * no copy uses it.
 */
final class PortEngine {

  private static final Logger log = LoggerFactory.getLogger(PortEngine.class);
  /** Steps whose metadata a late worker can still bind. */
  static final int KEPT_STEPS = 1024;
  /** How long a worker's bind waits for a step its scheduler named but the node has not built. */
  static final Duration BIND_WAIT = Duration.ofSeconds(5);
  /** Exported load events per layer of a worker (LoadEventRing). */
  static final int LOAD_EVENTS_PER_LAYER = 2;

  /**
   * One TP rank's worker with the memory it registered, the events it shared (save_kv_layer) and
   * the node's events exported to it for READ loads (wait_for_layer_load), with their handles.
   */
  private record Slot(
      PortSession session, ConnectorWorker worker, RegionRegistry registry,
      List<MemoryRegion> layers, KvCacheGeometry geometry, List<CudaEvent> events,
      List<CudaEvent> loadEvents, List<byte[]> loadEventHandles) {}

  private final PortHost host;
  private final EnginePortServer server;
  private final int incarnation;
  private final Role role;
  private final String engineId;
  private final TransferMode mode;
  private final int tpSize;
  private final Slot[] slots;
  private @Nullable PortSession schedulerSession;
  /** The engine's OpenAI-compatible base URL, from the scheduler's hello, if it serves one. */
  private @Nullable URI httpUrl;
  /** Its listing for routers' proxies, while the engine is attached. */
  private @Nullable ActorRef<HttpEndpoint.Command> listedEndpoint;
  private @Nullable ConnectorScheduler scheduler;
  private boolean detaching;
  /** The scheduler's requests by id, from get_num_new_matched_tokens to request_finished. */
  private final Map<String, ConnectorRequest> requests = new HashMap<>();
  private final Map<Long, ConnectorMetadata> steps = lastSteps();
  private long nextStep;
  /**
   * Steps a client named itself in build_connector_meta and the node refused, with why: a worker
   * binding one fails at once with the reason instead of waiting for a step that never comes.
   */
  private final Map<Long, String> refusedSteps = lastSteps();

  /** A map by step number that keeps the last {@link #KEPT_STEPS} entries put. */
  private static <V> Map<Long, V> lastSteps() {
    return new LinkedHashMap<>(16, 0.75f, false) {
      private static final long serialVersionUID = 1L;

      @Override
      protected boolean removeEldestEntry(Map.Entry<Long, V> eldest) {
        return size() > KEPT_STEPS;
      }
    };
  }

  PortEngine(PortHost host, EnginePortServer server, int incarnation, TransferMode mode) {
    this.host = host;
    this.server = server;
    this.incarnation = incarnation;
    this.role = host.role();
    this.mode = mode;
    this.engineId = host.engineId(mode);
    this.tpSize = host.tpSize();
    this.slots = new Slot[tpSize];
  }

  String engineId() {
    return engineId;
  }

  TransferMode mode() {
    return mode;
  }

  Role role() {
    return role;
  }

  int tpSize() {
    return tpSize;
  }

  synchronized boolean detaching() {
    return detaching;
  }

  /** No connection has joined it yet (a first hello that failed leaves it so). */
  synchronized boolean unjoined() {
    if (schedulerSession != null) {
      return false;
    }
    for (Slot s : slots) {
      if (s != null) {
        return false;
      }
    }
    return true;
  }

  synchronized void joinScheduler(PortSession session, @Nullable URI url) throws PortException {
    checkOpen();
    if (schedulerSession != null) {
      throw new PortException(PortError.ENGINE_BUSY,
          "engine " + engineId + " already has a scheduler connection");
    }
    schedulerSession = session;
    httpUrl = url;
    listEndpoint();
  }

  /** Lists the engine's HTTP endpoint once it has a URL and every worker. */
  private void listEndpoint() {
    URI url = httpUrl;
    if (url != null && scheduler != null && listedEndpoint == null) {
      listedEndpoint = new HttpEndpoint(role, engineId, host.dpRank(), host.dpSize(), mode, url)
          .list(host.system());
    }
  }

  /**
   * Maps the worker's memory, registers it with a new worker and lists the worker. With {@code
   * wantsLoadEvents} (the hello's {@code load_events}), a worker of D in READ mode on GPU memory
   * with the cuda transport also gets a ring of the node's interprocess events
   * ({@link #loadEventHandles}).
   */
  void joinWorker(PortSession session, int rank, KvCacheGeometry geometry,
      WorkerMemory memory, boolean wantsLoadEvents) throws PortException {
    synchronized (this) {
      checkOpen();
      if (slots[rank] != null) {
        throw new PortException(PortError.ENGINE_BUSY,
            "engine " + engineId + " already has a worker for TP rank " + rank);
      }
      for (Slot s : slots) {
        if (s != null && s.layers().size() != memory.layers()) {
          throw PortException.badArgs("worker TP rank " + rank + " has " + memory.layers()
              + " layers; TP rank " + s.worker().identity().tpRank() + " has " + s.layers().size());
        }
      }
    }
    EngineIdentity id = new EngineIdentity(
        role, engineId, host.dpRank(), host.dpSize(), rank, tpSize, mode);
    RegionRegistry registry = new RegionRegistry(id.label());
    List<MemoryRegion> layers = new ArrayList<>();
    List<CudaEvent> events = new ArrayList<>();
    List<CudaEvent> loadEvents = new ArrayList<>();
    List<byte[]> loadEventHandles = new ArrayList<>();
    int device = -1;
    ConnectorWorker worker = null;
    try {
      if (memory instanceof WorkerMemory.Host h) {
        for (WorkerMemory.Host.Layer m : h.layerFiles()) {
          layers.add(registry.mapSharedFile(m.path(), m.offset(), m.length()));
        }
      } else if (memory instanceof WorkerMemory.CudaIpc c) {
        device = cudaDevice(c.deviceUuid());
        ImportedGpuMemory imported = new ImportedGpuMemory(device);
        for (WorkerMemory.CudaIpc.Layer l : c.layerHandles()) {
          layers.add(imported.register(registry, l.handle(), l.offset(), l.length()));
        }
        for (byte[] h : c.eventHandles()) {
          events.add(CudaEvent.openIpc(device, h));
        }
      }
      synchronized (this) {
        checkOpen();
        if (slots[rank] != null) {
          throw new PortException(PortError.ENGINE_BUSY,
              "engine " + engineId + " already has a worker for TP rank " + rank);
        }
        worker = host.newWorker(id, registry);
        if (wantsLoadEvents && device >= 0 && role == Role.DECODE && mode == TransferMode.READ
            && worker.ordersLoadsOnGpu()) {
          // One slot per layer a step, twice over: a slot is recorded again a step later at the
          // soonest (LoadEventRing).
          for (int i = 0; i < LOAD_EVENTS_PER_LAYER * layers.size(); i++) {
            CudaEvent ev = CudaEvent.createInterprocess(device);
            loadEvents.add(ev);
            loadEventHandles.add(ev.ipcHandle());
          }
        }
        worker.registerKvCaches(geometry, layers);
        slots[rank] = new Slot(session, worker, registry, List.copyOf(layers), geometry,
            List.copyOf(events), List.copyOf(loadEvents), List.copyOf(loadEventHandles));
        if (allWorkersIn()) {
          List<ConnectorWorker> workers = workers();
          scheduler = new ConnectorScheduler(role, mode, engineId, host.dpRank(),
              geometry.blockSize(), workers.stream().map(ConnectorWorker::engineRef).toList(),
              host.connector(), Clock.systemUTC());
          host.engineAttached(engineId, mode, workers, scheduler);
          listEndpoint();
          notifyAll();
        }
      }
    } catch (IOException | CudaException e) {
      if (worker != null) {
        worker.shutdown();
      }
      events.forEach(CudaEvent::close);
      loadEvents.forEach(CudaEvent::close);
      registry.close();
      throw new PortException(PortError.BAD_MEMORY, String.valueOf(e.getMessage()));
    } catch (PortException | RuntimeException e) {
      if (worker != null) {
        worker.shutdown();
      }
      events.forEach(CudaEvent::close);
      loadEvents.forEach(CudaEvent::close);
      registry.close();
      throw e;
    }
  }

  /**
   * The node's GPU, which must be the one the engine's memory is on: device ids differ between
   * processes ({@code CUDA_VISIBLE_DEVICES}), UUIDs do not.
   */
  private int cudaDevice(String engineUuid) throws PortException {
    int device = host.gpu();
    if (device < 0) {
      throw new PortException(PortError.BAD_MEMORY, "the engine shares GPU memory (cuda_ipc) but"
          + " this node has no GPU: start it with --gpu N --transport cuda, N the engine's GPU");
    }
    if (!Cuda.available()) {
      throw new PortException(PortError.BAD_MEMORY, "the engine shares GPU memory (cuda_ipc) but"
          + " CUDA is not available to this node: " + Cuda.unavailableReason());
    }
    String mine = Cuda.deviceUuid(device);
    if (!sameUuid(mine, engineUuid)) {
      throw new PortException(PortError.BAD_MEMORY, "the engine's KV cache is on GPU "
          + engineUuid + " but this node's GPU " + device + " is " + mine
          + ": start the node with --gpu set to the engine's GPU");
    }
    return device;
  }

  /** UUIDs compared as nvidia-smi and PyTorch print them: with or without "GPU-" and dashes. */
  static boolean sameUuid(String a, String b) {
    return normalUuid(a).equals(normalUuid(b));
  }

  private static String normalUuid(String u) {
    String s = u.trim().toLowerCase(java.util.Locale.ROOT);
    if (s.startsWith("gpu-")) {
      s = s.substring(4);
    }
    return s.replace("-", "");
  }

  /** The interprocess events worker {@code rank} shared, by slot. */
  synchronized List<CudaEvent> events(int rank) {
    Slot s = slots[rank];
    return s == null ? List.of() : s.events();
  }

  /** The node's events exported to worker {@code rank} for READ loads, by slot; empty if none. */
  synchronized List<CudaEvent> loadEvents(int rank) {
    Slot s = slots[rank];
    return s == null ? List.of() : s.loadEvents();
  }

  /** The IPC handles of {@link #loadEvents}, for the hello reply. */
  synchronized List<byte[]> loadEventHandles(int rank) {
    Slot s = slots[rank];
    return s == null ? List.of() : s.loadEventHandles();
  }

  private boolean allWorkersIn() {
    for (Slot s : slots) {
      if (s == null) {
        return false;
      }
    }
    return true;
  }

  private List<ConnectorWorker> workers() {
    List<ConnectorWorker> out = new ArrayList<>();
    for (Slot s : slots) {
      if (s != null) {
        out.add(s.worker());
      }
    }
    return out;
  }

  synchronized ConnectorWorker worker(int rank) throws PortException {
    checkOpen();
    Slot s = slots[rank];
    if (s == null) {
      throw new PortException(PortError.INTERNAL, "no worker for TP rank " + rank);
    }
    return s.worker();
  }

  synchronized int layers(int rank) {
    Slot s = slots[rank];
    return s == null ? 0 : s.layers().size();
  }

  /** The scheduler once every TP rank's worker said hello, waiting up to {@code timeout}. */
  synchronized ConnectorScheduler awaitScheduler(Duration timeout) throws PortException {
    awaitWhile(() -> scheduler == null, timeout, () -> new PortException(PortError.WORKERS_MISSING,
        "engine " + engineId + ": " + workers().size() + " of " + tpSize
            + " TP workers said hello within " + timeout));
    checkOpen();
    return Objects.requireNonNull(scheduler);
  }

  /**
   * Waits on this engine's monitor (the caller holds it) while {@code waiting} holds, up to
   * {@code timeout}; throws {@code late}'s exception then, and NODE_STOPPING once the engine
   * detaches.
   */
  private void awaitWhile(BooleanSupplier waiting, Duration timeout, Supplier<PortException> late)
      throws PortException {
    long deadline = System.nanoTime() + timeout.toNanos();
    while (waiting.getAsBoolean()) {
      checkOpen();
      long left = deadline - System.nanoTime();
      if (left <= 0) {
        throw late.get();
      }
      try {
        TimeUnit.NANOSECONDS.timedWait(this, left);
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
        throw new PortException(PortError.NODE_STOPPING, "interrupted");
      }
    }
  }

  /** Scheduler connection only: its thread alone touches the request map. */
  Map<String, ConnectorRequest> requests() {
    return requests;
  }

  /** Keeps this step's metadata for the workers; returns the opaque bytes that name it. */
  synchronized byte[] putStep(ConnectorMetadata metadata) {
    return putStep(nextStep, metadata);
  }

  /** The number the next step's metadata gets: a client that names its step must name this. */
  synchronized long nextStep() {
    return nextStep;
  }

  /**
   * Keeps the metadata of {@code step}, which must be {@link #nextStep()} (a client named it in
   * build_connector_meta, or the node numbers it), and wakes workers waiting to bind it.
   */
  synchronized byte[] putStep(long step, ConnectorMetadata metadata) {
    if (step != nextStep) {
      throw new IllegalStateException("step " + step + " is not the next step " + nextStep);
    }
    nextStep = step + 1;
    steps.put(step, metadata);
    notifyAll();
    try {
      // "loads" lets a worker's client skip start_load_kv's round trip when nothing loads;
      // "saves" lets it skip the step's save_kv_layer and wait_for_save frames when nothing is
      // saved (ConnectorWorker ignores them then: only reqsToSave is written).
      return PortFrames.encode(Map.of("engine", incarnation, "step", step,
          "loads", metadata.reqsToRecv().size(), "saves", metadata.reqsToSave().size()));
    } catch (IOException e) {
      throw new IllegalStateException("msgpack of two ints failed", e);
    }
  }

  /**
   * A step a client named was refused (a wrong number, or its build failed): workers binding it
   * fail with {@code why}, and the number is never given to another step.
   */
  synchronized void refuseStep(long step, String why) {
    refusedSteps.put(step, why);
    if (step >= nextStep) {
      nextStep = step + 1;
    }
    notifyAll();
  }

  /**
   * The metadata a handle names. A client that names its steps sends build_connector_meta without
   * waiting for the reply, and its engine hands the handle to the workers at once: a worker's
   * bind may then arrive before the scheduler's build was read, so a step not built yet is waited
   * for, up to {@link #BIND_WAIT}.
   */
  synchronized ConnectorMetadata step(byte[] handle) throws PortException {
    Map<String, Object> m;
    try {
      m = PortFrames.decodeMap(handle);
    } catch (PortException e) {
      throw new PortException(PortError.UNKNOWN_METADATA, "metadata bytes are not kvferry's");
    }
    if (!(m.get("engine") instanceof Long e) || !(m.get("step") instanceof Long s)) {
      throw new PortException(PortError.UNKNOWN_METADATA, "metadata bytes are not kvferry's");
    }
    if (e != incarnation) {
      throw new PortException(PortError.UNKNOWN_METADATA,
          "metadata of an earlier attachment of engine " + engineId);
    }
    awaitWhile(() -> s >= nextStep, BIND_WAIT, () -> new PortException(
        PortError.UNKNOWN_METADATA, "step " + s + " of engine " + engineId + " was not built within "
            + BIND_WAIT.toMillis() + " ms of its bind (the last step built is " + (nextStep - 1)
            + ")"));
    // A refusal goes first: a client out of line may have named an older step's number, and its
    // handle must not bind that step's metadata (its saves would run again).
    String refused = refusedSteps.get(s);
    if (refused != null) {
      throw new PortException(PortError.UNKNOWN_METADATA, "step " + s + " of engine " + engineId
          + " was refused: " + refused);
    }
    ConnectorMetadata meta = steps.get(s);
    if (meta == null) {
      throw new PortException(PortError.UNKNOWN_METADATA, "step " + s + " of engine " + engineId
          + " is unknown or older than the last " + KEPT_STEPS + " steps");
    }
    // The worker's client skips load waits and save frames by the handle's counts: a handle whose
    // counts are not the step's binds nothing rather than run a step the engine does not follow.
    if (!(m.get("loads") instanceof Long loads) || !(m.get("saves") instanceof Long saves)
        || loads != meta.reqsToRecv().size() || saves != meta.reqsToSave().size()) {
      throw new PortException(PortError.UNKNOWN_METADATA, "step " + s + " of engine " + engineId
          + ": the handle's counts (loads " + m.get("loads") + ", saves " + m.get("saves")
          + ") are not the step's (" + meta.reqsToRecv().size() + ", "
          + meta.reqsToSave().size() + ")");
    }
    return meta;
  }

  private void checkOpen() throws PortException {
    if (detaching) {
      throw new PortException(PortError.NODE_STOPPING, "engine " + engineId + " is detaching");
    }
  }

  /**
   * Ends the engine: closes its other connections, stops its workers (the peers see them leave
   * and end their transfers), then closes transports and unmaps its memory once no copy uses it.
   * Idempotent; blocks until done.
   */
  void detach(String why) {
    List<Slot> taken = new ArrayList<>();
    List<PortSession> sessions = new ArrayList<>();
    synchronized (this) {
      if (detaching) {
        return;
      }
      detaching = true;
      notifyAll();
      for (Slot s : slots) {
        if (s != null) {
          taken.add(s);
          sessions.add(s.session());
        }
      }
      if (schedulerSession != null) {
        sessions.add(schedulerSession);
      }
      if (listedEndpoint != null) {
        HttpEndpoint.unlist(listedEndpoint); // routers stop sending it requests first
        listedEndpoint = null;
      }
    }
    log.info("engine {} ({}) detaches: {}", engineId, mode.configName(), why);
    sessions.forEach(PortSession::closeQuietly);
    List<CompletableFuture<Void>> stopped = new ArrayList<>();
    taken.forEach(s -> stopped.add(s.worker().stop()));
    try {
      CompletableFuture.allOf(stopped.toArray(CompletableFuture[]::new)).get(30, TimeUnit.SECONDS);
    } catch (Exception e) {
      log.warn("engine {}: workers did not stop within 30 s; closing anyway", engineId, e);
    }
    for (Slot s : taken) {
      s.worker().transport().close();
      // Unmapped only when the last copy using a region lets go of it (MemoryRegion pins).
      s.layers().forEach(MemoryRegion::close);
      s.registry().close();
      // The workers stopped and their copies landed: no stream waits on these any more.
      s.events().forEach(CudaEvent::close);
      // The worker's session is over (the client drops its copies of these with the
      // connection); every record was behind copies that have finished by now.
      s.loadEvents().forEach(CudaEvent::close);
    }
    host.engineDetached(engineId);
    server.engineGone(this);
  }
}
