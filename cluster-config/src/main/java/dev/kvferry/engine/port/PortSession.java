package dev.kvferry.engine.port;

import dev.kvferry.actors.connector.ConnectorMetadata;
import dev.kvferry.actors.connector.ConnectorRequest;
import dev.kvferry.actors.connector.ConnectorScheduler;
import dev.kvferry.actors.connector.ConnectorWorker;
import dev.kvferry.actors.connector.CudaLayerEvent;
import dev.kvferry.actors.connector.FinishDecision;
import dev.kvferry.actors.connector.Finished;
import dev.kvferry.actors.connector.HostLayerEvent;
import dev.kvferry.actors.connector.InvalidTransferParamsException;
import dev.kvferry.actors.connector.KvTransferParams;
import dev.kvferry.actors.connector.LayerLoadOrder;
import dev.kvferry.actors.connector.MatchedTokens;
import dev.kvferry.actors.connector.SchedulerOutput;
import dev.kvferry.actors.plan.KvCacheGeometry;
import dev.kvferry.engine.HttpEndpoint;
import dev.kvferry.rdma.cuda.CudaEvent;
import dev.kvferry.rdma.cuda.CudaException;
import java.io.IOException;
import java.net.URI;
import java.net.URISyntaxException;
import java.nio.channels.SocketChannel;
import java.time.Duration;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Objects;
import java.util.OptionalInt;
import java.util.Set;
import java.util.TreeSet;
import org.jspecify.annotations.Nullable;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * One connection of the engine port: the engine's scheduler or one TP rank's worker. Runs on its
 * own thread, one request at a time and in order, so replies come in the order of the requests (a
 * client may send several before reading their replies); a worker's blocking waits hold only its
 * own connection.
 */
final class PortSession implements Runnable {

  private static final Logger log = LoggerFactory.getLogger(PortSession.class);
  /** The protocol versions spoken here (docs/engine-port.md, "Versioning"). */
  static final List<Integer> SUPPORTED_VERSIONS = List.of(1, 2);
  /** The version that added {@code batch}. */
  static final int BATCH_VERSION = 2;
  /**
   * How long a session polls for the engine's next frame before it blocks
   * ({@code -Dkvferry.port.spin-us}, default 0: it blocks at once; at most 1 s). See
   * docs/engine-port.md for what it saves and costs.
   */
  static final long SPIN_NANOS = java.util.concurrent.TimeUnit.MICROSECONDS.toNanos(
      Math.max(0, Math.min(1_000_000, Long.getLong("kvferry.port.spin-us", 0))));

  /** One-way ops' errors kept for the next get_finished; beyond this they are only counted. */
  static final int KEPT_OP_ERRORS = 64;
  /** cudaIpcMemHandle_t and cudaIpcEventHandle_t are both 64 bytes. */
  static final int IPC_HANDLE_BYTES = 64;

  private enum Side { SCHEDULER, WORKER }

  private final EnginePortServer server;
  private final SocketChannel channel;
  private final PortFrames.Reader frames;
  private final Duration workersTimeout;
  private @Nullable Side side;
  /** The version this connection's hello settled on; 0 before hello. */
  private int version;
  private int rank = -1;
  private @Nullable PortEngine engine;
  private ConnectorMetadata bound = ConnectorMetadata.EMPTY;
  private final List<Map<String, Object>> opErrors = new ArrayList<>();
  private int droppedOpErrors;
  private final Set<Integer> loadErrorsSinceAsked = new TreeSet<>();
  /** Worker: the slots of the node's exported load events; null when none were exported. */
  private @Nullable LoadEventRing loadRing;
  private volatile boolean shutdownAsked;

  PortSession(EnginePortServer server, SocketChannel channel, Duration workersTimeout) {
    this.server = server;
    this.channel = channel;
    this.frames = new PortFrames.Reader(channel, 64 << 10, SPIN_NANOS);
    this.workersTimeout = workersTimeout;
  }

  @Override
  public void run() {
    String ended = "the engine closed the connection";
    try {
      while (true) {
        Map<String, Object> frame;
        try {
          frame = frames.next();
        } catch (PortException e) {
          reply(null, error(e));
          ended = "bad frame: " + e.getMessage();
          break;
        }
        if (frame == null) {
          break;
        }
        if (!handle(frame)) {
          ended = "fatal error";
          break;
        }
      }
    } catch (IOException e) {
      ended = "connection failed: " + e.getMessage();
    } finally {
      closeQuietly();
      PortEngine e = engine;
      if (e != null) {
        e.detach((side == Side.WORKER ? "worker TP rank " + rank : "scheduler") + ": "
            + (shutdownAsked ? "shutdown" : ended));
      }
      server.sessionEnded(this);
    }
  }

  /** Handles one request frame; false when the connection must close. */
  private boolean handle(Map<String, Object> frame) throws IOException {
    Object rawId = frame.get("id");
    if (rawId != null && !(rawId instanceof Long)) {
      reply(null, error(new PortException(PortError.BAD_FRAME, "id must be an integer or nil")));
      return false;
    }
    Long id = (Long) rawId;
    if (!(frame.get("op") instanceof String op)) {
      reply(id, error(new PortException(PortError.BAD_FRAME, "op must be a string")));
      return false;
    }
    if (op.equals("batch") && version >= BATCH_VERSION) {
      return batch(id, frame.get("args"));
    }
    return run(id, op, frame.get("args"));
  }

  /**
   * Version 2's {@code batch}: {@code args.ops} is a list of {@code [op, args]}, each run in order
   * as a one-way frame of its own would be (its error kept for the next get_finished or
   * build_connector_meta under its op's name). The Python client sends a step's held ops of
   * plain requests this way: one frame and one dispatch for hundreds of them.
   */
  private boolean batch(@Nullable Long id, @Nullable Object args) throws IOException {
    List<?> ops;
    try {
      ops = PortArgs.of("args", args).list("ops");
    } catch (PortException e) {
      return failed(id, "batch", e);
    }
    for (int i = 0; i < ops.size(); i++) {
      if (!(ops.get(i) instanceof List<?> element) || element.size() != 2
          || !(element.get(0) instanceof String op)) {
        keepOpError("batch", PortException.badArgs(
            "args.ops[" + i + "] must be [op (a string), args (a map or nil)]"));
        continue;
      }
      if (op.equals("hello") || op.equals("batch")) {
        keepOpError(op, PortException.badArgs(op + " cannot be sent in a batch"));
        continue;
      }
      if (!run(null, op, element.get(1))) {
        return false;
      }
    }
    if (id != null) {
      reply(id, Map.of("ok", Map.of()));
    }
    return !shutdownAsked;
  }

  /** Runs one op: replies when {@code id} is set, else keeps its error; false: close. */
  private boolean run(@Nullable Long id, String op, @Nullable Object args) throws IOException {
    try {
      Object result = dispatch(op, PortArgs.of("args", args));
      if (id != null) {
        reply(id, Map.of("ok", result));
      }
      return !shutdownAsked;
    } catch (PortException e) {
      return failed(id, op, e);
    } catch (RuntimeException e) {
      log.error("engine port: op {} failed", op, e);
      PortException internal = new PortException(PortError.INTERNAL, op + ": " + e);
      if (id != null) {
        reply(id, error(internal));
      } else {
        keepOpError(op, internal);
      }
      return true;
    }
  }

  private boolean failed(@Nullable Long id, String op, PortException e) throws IOException {
    if (id != null) {
      reply(id, error(e));
    } else {
      keepOpError(op, e);
    }
    return !e.error().fatal();
  }

  private Object dispatch(String op, PortArgs a) throws PortException {
    if (op.equals("hello")) {
      return hello(a);
    }
    if (op.equals("ping")) {
      return Map.of("node", server.host().nodeName());
    }
    if (side == null) {
      throw new PortException(PortError.HELLO_REQUIRED, op + " before hello");
    }
    return switch (op) {
      case "get_num_new_matched_tokens" -> matchedTokens(a);
      case "update_state_after_alloc" -> afterAlloc(a);
      case "build_connector_meta" -> buildMeta(a);
      case "request_finished" -> requestFinished(a);
      case "bind_connector_metadata" -> bind(a);
      case "start_load_kv" -> startLoad();
      case "wait_for_layer_load" -> waitForLayerLoad(a);
      case "save_kv_layer" -> saveLayer(a);
      case "wait_for_save" -> waitForSave();
      case "fence_saves" -> fenceSaves(a);
      case "get_finished" -> finished();
      case "get_block_ids_with_load_errors" -> loadErrors();
      case "shutdown" -> shutdown();
      default -> throw new PortException(PortError.UNKNOWN_OP, "unknown op " + op);
    };
  }

  // --- hello ---

  private Object hello(PortArgs a) throws PortException {
    if (side != null) {
      throw new PortException(PortError.ALREADY_HELLO, "this connection already said hello");
    }
    long asked = a.integer("version", 0, Long.MAX_VALUE);
    if (!SUPPORTED_VERSIONS.contains((int) Math.min(asked, Integer.MAX_VALUE))) {
      throw new PortException(PortError.BAD_VERSION,
          "protocol version " + asked + " is not spoken here; supported: " + SUPPORTED_VERSIONS);
    }
    List<byte[]> loadEventHandles = null;
    Side s = switch (a.string("side")) {
      case "scheduler" -> Side.SCHEDULER;
      case "worker" -> Side.WORKER;
      default -> throw PortException.badArgs("args.side must be \"scheduler\" or \"worker\"");
    };
    PortArgs identity = a.nested("engine");
    PortEngine e = server.engineFor(identity);
    try {
      if (s == Side.SCHEDULER) {
        URI url = null;
        String named = a.optionalString("http_url");
        if (named != null) {
          try {
            url = new URI(named);
            new HttpEndpoint(e.role(), e.engineId(), 0, 1, e.mode(), url); // checks the URL
          } catch (URISyntaxException | IllegalArgumentException ex) {
            throw PortException.badArgs("args.http_url: " + ex.getMessage());
          }
        }
        e.joinScheduler(this, url);
      } else {
        int tpRank = a.integer("tp_rank", 0);
        if (tpRank >= e.tpSize()) {
          throw PortException.badArgs("args.tp_rank = " + tpRank + " is outside TP size "
              + e.tpSize());
        }
        KvCacheGeometry geometry = geometry(a.nested("geometry"));
        boolean wantsLoadEvents = a.bool("load_events", false);
        e.joinWorker(this, tpRank, geometry, memory(a.nested("memory"), a, geometry),
            wantsLoadEvents);
        rank = tpRank;
        loadEventHandles = wantsLoadEvents ? e.loadEventHandles(tpRank) : null;
        if (loadEventHandles != null && !loadEventHandles.isEmpty()) {
          loadRing = new LoadEventRing(loadEventHandles.size());
        }
      }
    } catch (PortException | RuntimeException failed) {
      server.forgetIfUnjoined(e); // a first hello's: the node keeps no engine nobody joined
      throw failed;
    }
    side = s;
    engine = e;
    version = (int) asked;
    Map<String, Object> r = new LinkedHashMap<>();
    r.put("version", version);
    r.put("node", server.host().nodeName());
    r.put("engine_id", e.engineId());
    r.put("role", e.role().clusterRole());
    r.put("mode", e.mode().configName());
    r.put("dp_rank", server.host().dpRank());
    r.put("tp_size", e.tpSize());
    r.put("transport", server.host().transportName());
    if (s == Side.SCHEDULER) {
      // What a client needs to name its steps itself (build_connector_meta's step): the counts
      // its handles carry follow from these.
      r.put("client_steps", true);
      r.put("reads_at_admission", server.host().connector().readsAtAdmission());
    }
    if (loadEventHandles != null) {
      // Asked for: the ring (empty where loads are not GPU-ordered: host memory, another
      // transport, not D in READ mode), so the client knows which wait it gets.
      r.put("load_events", loadEventHandles);
    }
    return r;
  }

  private static KvCacheGeometry geometry(PortArgs g) throws PortException {
    try {
      return switch (g.string("layout")) {
        case "standard" -> KvCacheGeometry.standard(g.integer("num_blocks", 1),
            g.integer("block_size", 1), g.integer("kv_heads", 1), g.integer("head_dim", 1),
            g.integer("dtype_bytes", 1));
        case "blocks_first" -> KvCacheGeometry.blocksFirst(g.integer("num_blocks", 1),
            g.integer("block_size", 1), g.integer("kv_heads", 1), g.integer("head_dim", 1),
            g.integer("dtype_bytes", 1));
        case "mla" -> KvCacheGeometry.mla(g.integer("num_blocks", 1), g.integer("block_size", 1),
            g.integer("latent", 1), g.integer("dtype_bytes", 1));
        default -> throw PortException.badArgs(
            "args.geometry.layout must be standard, blocks_first or mla");
      };
    } catch (IllegalArgumentException | ArithmeticException e) {
      throw PortException.badArgs("args.geometry: " + e.getMessage());
    }
  }

  private static WorkerMemory memory(PortArgs m, PortArgs hello, KvCacheGeometry g)
      throws PortException {
    String kind = m.string("kind");
    List<PortArgs> layers = m.mapList("layers");
    if (layers.isEmpty()) {
      throw PortException.badArgs("args.memory.layers is empty");
    }
    switch (kind) {
      case "host" -> {
        List<WorkerMemory.Host.Layer> out = new ArrayList<>();
        for (PortArgs l : layers) {
          out.add(new WorkerMemory.Host.Layer(SharedFileCheck.check(l.string("path")),
              l.integer("offset", 0, Long.MAX_VALUE), layerLength(l, g)));
        }
        return new WorkerMemory.Host(out);
      }
      case "cuda_ipc" -> {
        List<WorkerMemory.CudaIpc.Layer> out = new ArrayList<>();
        for (PortArgs l : layers) {
          byte[] handle = l.bytes("handle");
          if (handle.length != IPC_HANDLE_BYTES) {
            throw PortException.badArgs(l.where() + ".handle must be a " + IPC_HANDLE_BYTES
                + "-byte cudaIpcMemHandle_t, got " + handle.length + " bytes");
          }
          out.add(new WorkerMemory.CudaIpc.Layer(handle, l.integer("offset", 0, Long.MAX_VALUE),
              layerLength(l, g)));
        }
        return new WorkerMemory.CudaIpc(m.string("device_uuid"), out,
            hello.bytesList("events", IPC_HANDLE_BYTES));
      }
      default -> throw new PortException(PortError.BAD_MEMORY, "memory kind " + kind
          + " is not served: host (a /dev/shm file) or cuda_ipc (CUDA IPC handles)");
    }
  }

  private static long layerLength(PortArgs l, KvCacheGeometry g) throws PortException {
    long length = l.integer("length", 1, Long.MAX_VALUE);
    if (length != g.layerRegionBytes()) {
      throw new PortException(PortError.BAD_MEMORY, l.where() + ".length = " + length
          + " but the geometry's layer holds " + g.layerRegionBytes() + " bytes");
    }
    return length;
  }

  // --- scheduler ops ---

  private ConnectorScheduler scheduler() throws PortException {
    PortEngine e = requireSide(Side.SCHEDULER);
    return e.awaitScheduler(workersTimeout);
  }

  private ConnectorRequest request(PortArgs a) throws PortException {
    String id = a.string("request_id");
    ConnectorRequest r = requireSide(Side.SCHEDULER).requests().get(id);
    if (r == null) {
      throw new PortException(PortError.UNKNOWN_REQUEST, "request " + id
          + " is unknown: name it in get_num_new_matched_tokens first (or it already finished)");
    }
    return r;
  }

  private Object matchedTokens(PortArgs a) throws PortException {
    ConnectorScheduler s = scheduler();
    String id = a.string("request_id");
    Map<String, ConnectorRequest> requests = requireSide(Side.SCHEDULER).requests();
    ConnectorRequest r = requests.get(id);
    int computed = a.integer("num_computed_tokens", 0);
    if (r == null) {
      int prompt = a.integer("num_prompt_tokens", 0);
      Map<String, Object> raw = a.optionalMap("kv_transfer_params");
      KvTransferParams params = null;
      if (raw != null) {
        try {
          params = KvTransferParams.fromMap(raw);
        } catch (InvalidTransferParamsException e) {
          throw PortException.badArgs(String.valueOf(e.getMessage()));
        }
      }
      r = new ConnectorRequest(id, prompt, params);
      requests.put(id, r);
    }
    MatchedTokens m = s.numNewMatchedTokens(r, computed);
    checkAnswered(a, id, m);
    return Map.of("count", m.count(), "async", m.async());
  }

  /**
   * A client that answered the engine itself (one-way, docs/engine-port.md) says what it
   * answered; an answer other than the node's is refused, so that a client whose copy of these
   * rules drifted from the node's is heard of (in the next build_connector_meta's op_errors).
   */
  private static void checkAnswered(PortArgs a, String id, MatchedTokens m) throws PortException {
    PortArgs told = answered(a);
    if (told == null) {
      return;
    }
    long count = told.integer("count", 0, Integer.MAX_VALUE);
    boolean async = told.bool("async", false);
    if (count != m.count() || async != m.async()) {
      throw PortException.badArgs("get_num_new_matched_tokens of " + id + ": the client answered ("
          + count + ", " + async + "), the node's answer is (" + m.count() + ", " + m.async()
          + ")");
    }
  }

  /** What a client that answered the engine itself says it answered, if it did. */
  private static @Nullable PortArgs answered(PortArgs a) throws PortException {
    Map<String, Object> answered = a.optionalMap("answered");
    return answered == null ? null : PortArgs.of("answered", answered);
  }

  private Object afterAlloc(PortArgs a) throws PortException {
    ConnectorScheduler s = scheduler();
    s.updateStateAfterAlloc(request(a), a.intList("block_ids", true),
        a.integer("num_external_tokens", 0));
    return Map.of();
  }

  /**
   * build_connector_meta. A client may name the step itself ({@code step}, which must be the next
   * one) with the counts its handle carries ({@code answered}: {@code loads}, {@code saves}), and
   * hand its own handle to the workers without waiting for this reply (docs/engine-port.md). The
   * node then builds that step; counts other than its own are refused, the step kept as the node
   * built it. A named step whose build fails is refused for the workers' binds too.
   */
  private Object buildMeta(PortArgs a) throws PortException {
    if (!a.has("step")) {
      return buildMeta(a, null);
    }
    long step = a.integer("step", 0, Long.MAX_VALUE - 1); // its successor must be a step too
    PortEngine e = requireSide(Side.SCHEDULER);
    long next = e.nextStep();
    if (step != next) {
      // Out of line (a client's bug): whatever its handle names, workers must not bind it.
      PortException wrong = PortException.badArgs("build_connector_meta named step " + step
          + ", but the next step of engine " + e.engineId() + " is " + next);
      e.refuseStep(step, String.valueOf(wrong.getMessage()));
      throw wrong;
    }
    try {
      return buildMeta(a, step);
    } catch (PortException ex) {
      if (e.nextStep() <= step) { // not built: workers binding it must not wait for it
        e.refuseStep(step, String.valueOf(ex.getMessage()));
      }
      throw ex;
    }
  }

  private Object buildMeta(PortArgs a, @Nullable Long named) throws PortException {
    ConnectorScheduler s = scheduler();
    PortArgs told = named == null ? null : answered(a);
    if (named != null && told == null) {
      throw PortException.badArgs("build_connector_meta named step " + named + " without the"
          + " counts its handle carries (args.answered: loads, saves)");
    }
    List<SchedulerOutput.NewRequest> fresh = new ArrayList<>();
    for (PortArgs r : a.mapList("scheduled_new_reqs")) {
      fresh.add(new SchedulerOutput.NewRequest(r.string("request_id"),
          r.intList("block_ids", true), r.optionalInt("num_computed_tokens", 0, -1)));
    }
    List<SchedulerOutput.CachedRequest> cached = new ArrayList<>();
    for (PortArgs r : a.mapList("scheduled_cached_reqs")) {
      cached.add(new SchedulerOutput.CachedRequest(r.string("request_id"),
          r.intList("new_block_ids", true), r.optionalInt("num_computed_tokens", 0, -1),
          r.bool("resumed", false)));
    }
    long toldLoads = told == null ? 0 : told.integer("loads", 0, Integer.MAX_VALUE);
    long toldSaves = told == null ? 0 : told.integer("saves", 0, Integer.MAX_VALUE);
    ConnectorMetadata meta = s.buildConnectorMeta(new SchedulerOutput(fresh, cached));
    PortEngine e = requireSide(Side.SCHEDULER);
    Map<String, Object> out = new LinkedHashMap<>();
    out.put("metadata", named == null ? e.putStep(meta) : e.putStep(named, meta));
    if (told != null && (toldLoads != meta.reqsToRecv().size()
        || toldSaves != meta.reqsToSave().size())) {
      // The workers act on the client's counts (whether to wait for loads, send saves): say so
      // now. The op errors held for this reply stay for the next one.
      throw PortException.badArgs("build_connector_meta of step " + named + ": the client"
          + " answered loads " + toldLoads + ", saves " + toldSaves + "; the node's are "
          + meta.reqsToRecv().size() + " and " + meta.reqsToSave().size()
          + " (the step is kept as the node built it)");
    }
    // One-way scheduler ops (update_state_after_alloc sent without an id) report here.
    out.put("op_errors", drainOpErrors());
    return out;
  }

  private Object requestFinished(PortArgs a) throws PortException {
    ConnectorScheduler s = scheduler();
    String id = a.string("request_id");
    ConnectorRequest r = requireSide(Side.SCHEDULER).requests().get(id);
    if (r == null) {
      // vLLM finishes a request aborted while waiting without ever asking about it: with its
      // params the connector still tells P to free; without, nothing here holds anything.
      Map<String, Object> raw = a.optionalMap("kv_transfer_params");
      if (raw == null) {
        Map<String, Object> none = new LinkedHashMap<>();
        none.put("delay_free", false);
        none.put("kv_transfer_params", null);
        return none;
      }
      try {
        r = new ConnectorRequest(id, a.optionalInt("num_prompt_tokens", 0, 0),
            KvTransferParams.fromMap(raw));
      } catch (InvalidTransferParamsException e) {
        throw PortException.badArgs(String.valueOf(e.getMessage()));
      }
    }
    r.setStatus(switch (a.string("status")) {
      case "length_capped" -> ConnectorRequest.Status.FINISHED_LENGTH_CAPPED;
      case "stopped" -> ConnectorRequest.Status.FINISHED_STOPPED;
      case "aborted" -> ConnectorRequest.Status.FINISHED_ABORTED;
      default -> throw PortException.badArgs(
          "args.status must be length_capped, stopped or aborted");
    });
    FinishDecision d = s.requestFinished(r, a.intList("block_ids", true));
    requireSide(Side.SCHEDULER).requests().remove(r.requestId());
    Map<String, Object> out = new LinkedHashMap<>();
    out.put("delay_free", d.delayFreeBlocks());
    KvTransferParams p = d.paramsForPeer();
    Map<String, Object> forPeer = p == null ? null : p.toMap();
    out.put("kv_transfer_params", forPeer);
    // Checked once the request is finished: the engine acted on the client's answer already, and
    // the node must not keep a request the engine has let go of.
    checkFinishAnswered(a, id, d.delayFreeBlocks(), forPeer);
    return out;
  }

  /**
   * A prefill engine's client answers request_finished itself for requests it can (one-way,
   * docs/engine-port.md) and says what it answered; an answer other than the node's is refused
   * like get_num_new_matched_tokens' (it comes back in the next build_connector_meta's
   * op_errors, and the client asks again from then on).
   */
  private static void checkFinishAnswered(PortArgs a, String id, boolean nodesDelay,
      @Nullable Map<String, Object> nodesParams) throws PortException {
    PortArgs told = answered(a);
    if (told == null) {
      return;
    }
    boolean delay = told.bool("delay_free", false);
    Map<String, Object> raw = told.optionalMap("kv_transfer_params");
    Map<String, Object> params;
    try {
      params = raw == null ? null : KvTransferParams.fromMap(raw).toMap();
    } catch (InvalidTransferParamsException e) {
      throw PortException.badArgs("request_finished of " + id + ": the client answered "
          + e.getMessage());
    }
    if (delay != nodesDelay || !Objects.equals(params, nodesParams)) {
      throw PortException.badArgs("request_finished of " + id + ": the client answered ("
          + delay + ", " + params + "), the node's answer is (" + nodesDelay + ", " + nodesParams
          + ")");
    }
  }

  // --- worker ops ---

  private ConnectorWorker worker() throws PortException {
    return requireSide(Side.WORKER).worker(rank);
  }

  private Object bind(PortArgs a) throws PortException {
    PortEngine e = requireSide(Side.WORKER);
    bound = ConnectorMetadata.EMPTY; // a bad handle binds nothing rather than the last step
    bound = e.step(a.bytes("metadata"));
    return Map.of();
  }

  private Object startLoad() throws PortException {
    ConnectorWorker w = worker();
    LoadEventRing ring = loadRing;
    if (ring != null) {
      ring.stepBegins(); // the engine's waits on the last step's slots are queued by now
    }
    w.startLoadKv(bound);
    return Map.of("loads", bound.reqsToRecv().size());
  }

  private int layer(PortArgs a) throws PortException {
    int layers = requireSide(Side.WORKER).layers(rank);
    return (int) a.integer("layer", 0, layers - 1L);
  }

  private Object waitForLayerLoad(PortArgs a) throws PortException {
    ConnectorWorker w = worker();
    int layer = layer(a);
    try {
      LoadEventRing ring = loadRing;
      OptionalInt slot = ring == null ? OptionalInt.empty() : ring.take();
      if (ring != null && slot.isPresent()) {
        // GPU memory, cuda transport: answer once the layer's reads are queued, with the slot
        // recorded behind them; the engine's stream waits for it (no CPU wait for the copies).
        int s = slot.getAsInt();
        CudaEvent event = requireSide(Side.WORKER).loadEvents(rank).get(s);
        LayerLoadOrder order;
        try {
          order = w.waitForLayerQueued(layer, event);
        } catch (CudaException e) {
          ring.returnUnused(s);
          log.warn("engine port: recording load event slot {} for layer {} failed; the engine's"
              + " CPU waits for the copies instead", s, layer, e);
          return Map.of("ok", w.waitForLayerLoad(layer));
        }
        return switch (order) {
          case EVENT_RECORDED -> Map.of("ok", true, "event_slot", s);
          case NOTHING_IN_FLIGHT -> {
            ring.returnUnused(s);
            yield Map.of("ok", true);
          }
          case TIMED_OUT -> {
            ring.returnUnused(s);
            yield Map.of("ok", false);
          }
        };
      }
      // Host memory, or no free slot this step: the CPU waits until the layer's reads landed.
      return Map.of("ok", w.waitForLayerLoad(layer));
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw new PortException(PortError.NODE_STOPPING, "interrupted");
    }
  }

  private Object saveLayer(PortArgs a) throws PortException {
    ConnectorWorker w = worker();
    int layer = layer(a);
    if (a.has("event_slot")) {
      // GPU memory: the node's copy stream waits for the event the engine recorded after the
      // layer's writes (cudaStreamWaitEvent); no CPU thread waits.
      List<CudaEvent> events = requireSide(Side.WORKER).events(rank);
      if (events.isEmpty()) {
        throw PortException.badArgs("args.event_slot given, but this worker's hello shared no"
            + " events");
      }
      int slot = (int) a.integer("event_slot", 0, events.size() - 1L);
      w.saveKvLayer(bound, layer, new CudaLayerEvent(events.get(slot)));
    } else {
      // Host memory: the engine wrote the layer before it sent this frame, so it is complete
      // (GPU memory without an event: the engine synchronized its stream before sending).
      w.saveKvLayer(bound, layer, HostLayerEvent.completed());
    }
    return Map.of();
  }

  private Object waitForSave() throws PortException {
    worker().waitForSave();
    return Map.of();
  }

  /**
   * vLLM's {@code handle_preemptions}: answers once no copy reads the preempted requests' blocks
   * any more (their saved transfers fail; D recomputes). An answer that cannot be given in time
   * is an error: the engine must not reuse those blocks then.
   */
  private Object fenceSaves(PortArgs a) throws PortException {
    List<String> ids = a.stringList("request_ids");
    boolean fenced;
    try {
      fenced = worker().fenceSavesAndWait(ids);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw new PortException(PortError.NODE_STOPPING, "the node is stopping");
    } catch (IllegalStateException e) {
      throw new PortException(PortError.NODE_STOPPING, "fence_saves: " + e.getMessage());
    }
    if (!fenced) {
      throw new PortException(PortError.INTERNAL, "fence_saves: copies of " + ids
          + " still read their blocks after the transfer timeout; do not reuse them");
    }
    return Map.of();
  }

  private Object finished() throws PortException {
    Finished f = worker().getFinished();
    loadErrorsSinceAsked.addAll(f.blockIdsWithLoadErrors());
    Map<String, Object> out = new LinkedHashMap<>();
    out.put("done_sending", List.copyOf(f.doneSending()));
    out.put("done_receiving", List.copyOf(f.doneReceiving()));
    out.put("failed", f.failed());
    out.put("block_ids_with_load_errors", List.copyOf(new TreeSet<>(f.blockIdsWithLoadErrors())));
    out.put("op_errors", drainOpErrors());
    return out;
  }

  /** The errors of one-way ops since the last call, plus a count of those not kept. */
  private List<Map<String, Object>> drainOpErrors() {
    List<Map<String, Object>> errors = new ArrayList<>(opErrors);
    if (droppedOpErrors > 0) {
      errors.add(Map.of("op", "*", "code", PortError.INTERNAL.code(),
          "message", droppedOpErrors + " more one-way op errors were dropped"));
    }
    opErrors.clear();
    droppedOpErrors = 0;
    return errors;
  }

  private Object loadErrors() throws PortException {
    requireSide(Side.WORKER);
    List<Integer> ids = List.copyOf(loadErrorsSinceAsked);
    loadErrorsSinceAsked.clear();
    return Map.of("block_ids", ids);
  }

  private Object shutdown() throws PortException {
    requireSide(Side.WORKER);
    shutdownAsked = true;
    return Map.of();
  }

  private PortEngine requireSide(Side wanted) throws PortException {
    PortEngine e = engine;
    if (side != wanted || e == null) {
      throw new PortException(PortError.WRONG_SIDE, "a " + wanted.name().toLowerCase()
          + " op on a " + String.valueOf(side).toLowerCase() + " connection");
    }
    return e;
  }

  // --- frames ---

  private void keepOpError(String op, PortException e) {
    if (opErrors.size() < KEPT_OP_ERRORS) {
      opErrors.add(Map.of("op", op, "code", e.error().code(),
          "message", String.valueOf(e.getMessage())));
    } else {
      droppedOpErrors++;
    }
  }

  private static Map<String, Object> error(PortException e) {
    return Map.of("error", Map.of("code", e.error().code(),
        "message", String.valueOf(e.getMessage())));
  }

  private void reply(@Nullable Long id, Map<String, Object> body) throws IOException {
    Map<String, Object> frame = new LinkedHashMap<>();
    frame.put("id", id);
    frame.putAll(body);
    PortFrames.write(channel, frame);
  }

  /** Refuses a peer before any frame is read (another uid). */
  void refuse(PortException e) {
    try {
      reply(null, error(e));
    } catch (IOException ignored) {
      // the peer went already
    }
    closeQuietly();
  }

  void closeQuietly() {
    try {
      channel.close();
    } catch (IOException ignored) {
      // closing is best effort
    }
  }
}
