package dev.kvferry.engine.port;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvferry.node.EngineNode;
import dev.kvferry.node.FreePorts;
import dev.kvferry.node.KvferryConfig;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.MappedByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.nio.file.attribute.PosixFilePermissions;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Random;
import java.util.UUID;
import org.apache.pekko.actor.testkit.typed.javadsl.TestProbe;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * The engine port against real nodes: a P and a D node (two actor systems in one cluster, cma
 * between them), each driven through its socket by this test acting as the engine, with its KV
 * cache in a /dev/shm file the node maps. Bytes written into P's blocks must arrive in D's.
 */
class EnginePortTest {

  static final int LAYERS = 3;
  static final int NUM_BLOCKS = 16;
  static final int BLOCK_SIZE = 4;
  static final int KV_HEADS = 2;
  static final int HEAD_DIM = 8;
  /** One block of K or V: block_size x kv_heads x head_dim x 2 bytes. */
  static final int BLOCK_BYTES = BLOCK_SIZE * KV_HEADS * HEAD_DIM * 2;
  static final long LAYER_BYTES = 2L * NUM_BLOCKS * BLOCK_BYTES;

  @TempDir Path dir;
  private final List<AutoCloseable> open = new ArrayList<>();
  private final List<Path> shm = new ArrayList<>();

  @AfterEach
  void stop() throws Exception {
    for (int i = open.size() - 1; i >= 0; i--) {
      open.get(i).close();
    }
    for (Path p : shm) {
      Files.deleteIfExists(p);
    }
  }

  private EngineNode node(String role, String engineId, String mode, Path socket, int port,
      int seedPort) throws IOException {
    return node(role, engineId, mode, socket, port, seedPort, true);
  }

  private EngineNode node(String role, String engineId, String mode, Path socket, int port,
      int seedPort, boolean readsAtAdmission) throws IOException {
    Map<String, Object> m = new HashMap<>();
    m.put("kvferry.connector.reads-at-admission", readsAtAdmission);
    m.put("kvferry.node.role", role);
    m.put("kvferry.node.engine-id", engineId);
    m.put("kvferry.node.mode", mode);
    m.put("kvferry.node.engine", "port");
    m.put("kvferry.node.engine-port.socket", socket.toString());
    m.put("kvferry.node.engine-port.workers-timeout", "5s");
    m.put("kvferry.connector.transfer-timeout", "20s");
    m.put("pekko.loglevel", "WARNING");
    m.put("pekko.coordinated-shutdown.exit-jvm", "off");
    m.put("pekko.coordinated-shutdown.run-by-jvm-shutdown-hook", "off");
    m.put("pekko.cluster.jmx.multi-mbeans-in-same-jvm", "on");
    m.put("pekko.remote.artery.canonical.hostname", "127.0.0.1");
    m.put("pekko.remote.artery.canonical.port", port);
    m.put("pekko.cluster.seed-nodes", List.of("pekko://kvferry@127.0.0.1:" + seedPort));
    m.put("pekko.cluster.roles", List.of(role));
    EngineNode n = EngineNode.start(KvferryConfig.load(m));
    open.add(n);
    return n;
  }

  /** A prefill node of engine p0 in {@code modes}, alone in its cluster: its port's socket. */
  private Path prefillNode(String modes) throws IOException {
    int port = FreePorts.next();
    Path socket = dir.resolve("p.sock");
    node("prefill", "p0", modes, socket, port, port);
    return socket;
  }

  /** A KV cache file of {@link #LAYERS} layers, 0600, as an engine makes it. */
  private Path kvFile() throws IOException {
    Path p = Path.of("/dev/shm", "kvferry-port-test-" + UUID.randomUUID());
    Files.createFile(p, PosixFilePermissions.asFileAttribute(PosixFilePermissions.fromString("rw-------")));
    shm.add(p);
    try (FileChannel c = FileChannel.open(p, StandardOpenOption.WRITE)) {
      c.write(ByteBuffer.allocate(1), LAYERS * LAYER_BYTES - 1);
    }
    return p;
  }

  private static MappedByteBuffer map(Path p) throws IOException {
    try (FileChannel c = FileChannel.open(p, StandardOpenOption.READ, StandardOpenOption.WRITE)) {
      return c.map(FileChannel.MapMode.READ_WRITE, 0, LAYERS * LAYER_BYTES);
    }
  }

  private static Map<String, Object> geometry() {
    return Map.of("layout", "standard", "num_blocks", NUM_BLOCKS, "block_size", BLOCK_SIZE,
        "kv_heads", KV_HEADS, "head_dim", HEAD_DIM, "dtype_bytes", 2);
  }

  private static Map<String, Object> memory(Path file, long length) {
    List<Map<String, Object>> layers = new ArrayList<>();
    for (int l = 0; l < LAYERS; l++) {
      layers.add(Map.of("path", file.toString(), "offset", l * LAYER_BYTES, "length", length));
    }
    return Map.of("kind", "host", "layers", layers);
  }

  private PortTestClient client(Path socket) throws IOException {
    PortTestClient c = new PortTestClient(socket);
    open.add(c);
    return c;
  }

  private PortTestClient worker(Path socket, Path file, String mode) throws Exception {
    PortTestClient w = client(socket);
    w.ok("hello", workerHello(file, mode, false));
    return w;
  }

  /** A worker's hello; {@code asksLoadEvents} asks for the node's load-event ring. */
  private static Map<String, Object> workerHello(Path file, String mode, boolean asksLoadEvents) {
    Map<String, Object> hello = new HashMap<>(Map.of("version", 1, "side", "worker",
        "engine", Map.of("mode", mode), "tp_rank", 0, "geometry", geometry(),
        "memory", memory(file, LAYER_BYTES)));
    if (asksLoadEvents) {
      hello.put("load_events", true);
    }
    return hello;
  }

  private PortTestClient scheduler(Path socket, String mode) throws Exception {
    PortTestClient s = client(socket);
    s.ok("hello", Map.of("version", 1, "side", "scheduler", "engine", Map.of("mode", mode)));
    return s;
  }

  @Test
  void badInputGetsItsErrorCodeAndTheNodeKeepsServing() throws Exception {
    Path socket = prefillNode("write");
    assertEquals("rw-------",
        PosixFilePermissions.toString(Files.getPosixFilePermissions(socket)));

    PortTestClient c = client(socket);
    assertEquals("hello_required", PortTestClient.errorCode(c.call("start_load_kv", Map.of())));
    assertEquals("bad_args", PortTestClient.errorCode(c.call("hello", Map.of("version", 1))));
    assertEquals("identity_mismatch", PortTestClient.errorCode(c.call("hello",
        Map.of("version", 1, "side", "scheduler", "engine", Map.of("role", "decode")))));
    assertEquals("identity_mismatch", PortTestClient.errorCode(c.call("hello",
        Map.of("version", 1, "side", "scheduler", "engine", Map.of("mode", "read")))));
    c.ok("hello", Map.of("version", 1, "side", "scheduler", "engine", Map.of("engine_id", "p0")));
    assertEquals("already_hello", PortTestClient.errorCode(c.call("hello",
        Map.of("version", 1, "side", "scheduler"))));
    assertEquals("unknown_op", PortTestClient.errorCode(c.call("frobnicate", Map.of())));
    // batch came with version 2; this connection said hello with version 1
    assertEquals("unknown_op", PortTestClient.errorCode(c.call("batch", Map.of("ops", List.of()))));
    assertEquals("wrong_side", PortTestClient.errorCode(c.call("start_load_kv", Map.of())));

    // A worker whose memory is open to others, or of the wrong length, is refused.
    Path open = kvFile();
    Files.setPosixFilePermissions(open, PosixFilePermissions.fromString("rw-r--r--"));
    PortTestClient w = client(socket);
    assertEquals("bad_memory", PortTestClient.errorCode(w.call("hello", Map.of("version", 1,
        "side", "worker", "tp_rank", 0, "geometry", geometry(),
        "memory", memory(open, LAYER_BYTES)))));
    Path file = kvFile();
    assertEquals("bad_memory", PortTestClient.errorCode(w.call("hello", Map.of("version", 1,
        "side", "worker", "tp_rank", 0, "geometry", geometry(),
        "memory", memory(file, LAYER_BYTES - 1)))));
    assertEquals("bad_memory", PortTestClient.errorCode(w.call("hello", Map.of("version", 1,
        "side", "worker", "tp_rank", 0, "geometry", geometry(), "memory",
        Map.of("kind", "host", "layers", List.of(Map.of("path", "/dev/shm/../etc/passwd",
            "offset", 0, "length", LAYER_BYTES)))))));
    assertEquals("bad_args", PortTestClient.errorCode(w.call("hello", Map.of("version", 1,
        "side", "worker", "tp_rank", 1, "geometry", geometry(),
        "memory", memory(file, LAYER_BYTES)))));
    // GPU memory (CUDA IPC handles) on a node without a GPU: refused, naming what to do.
    Map<String, Object> gpuLayer = Map.of("handle", new byte[64], "offset", 0, "length", LAYER_BYTES);
    Map<String, Object> gpuHello = Map.of("version", 1, "side", "worker", "tp_rank", 0,
        "geometry", geometry(), "memory", Map.of("kind", "cuda_ipc", "device_uuid",
            "GPU-00000000-0000-0000-0000-000000000000", "layers", List.of(gpuLayer, gpuLayer)));
    Map<String, Object> gpuRefused = w.call("hello", gpuHello);
    assertEquals("bad_memory", PortTestClient.errorCode(gpuRefused));
    assertTrue(gpuRefused.toString().contains("--gpu"), gpuRefused.toString());
    Map<String, Object> loadEventsNotABool = new HashMap<>(workerHello(file, "write", false));
    loadEventsNotABool.put("load_events", "yes");
    Map<String, Object> refused = w.call("hello", loadEventsNotABool);
    assertEquals("bad_args", PortTestClient.errorCode(refused));
    assertTrue(refused.toString().contains("load_events"), refused.toString());
    assertEquals("bad_args", PortTestClient.errorCode(w.call("hello", Map.of("version", 1,
        "side", "worker", "tp_rank", 0, "geometry", geometry(), "memory", Map.of("kind",
            "cuda_ipc", "device_uuid", "GPU-0", "layers", List.of(Map.of("handle", new byte[10],
                "offset", 0, "length", LAYER_BYTES)))))));
    w.ok("hello", Map.of("version", 1, "side", "worker", "tp_rank", 0, "geometry", geometry(),
        "memory", memory(file, LAYER_BYTES)));
    assertEquals("bad_args",
        PortTestClient.errorCode(w.call("wait_for_layer_load", Map.of("layer", LAYERS))));
    w.oneWay("bind_connector_metadata", Map.of("metadata", new byte[] {1, 2, 3}));
    w.oneWay("save_kv_layer", Map.of("layer", -1));
    w.oneWay("save_kv_layer", Map.of("layer", 0, "event_slot", 0)); // host memory: no events
    @SuppressWarnings("unchecked")
    List<Map<String, Object>> opErrors =
        (List<Map<String, Object>>) w.ok("get_finished", Map.of()).get("op_errors");
    assertEquals(List.of("unknown_metadata", "bad_args", "bad_args"),
        opErrors.stream().map(e -> e.get("code")).toList());

    // vLLM's handle_preemptions: a worker op; ids of requests with nothing saved answer at once.
    assertEquals("wrong_side", PortTestClient.errorCode(c.call("fence_saves",
        Map.of("request_ids", List.of("r")))));
    assertEquals("bad_args", PortTestClient.errorCode(w.call("fence_saves",
        Map.of("request_ids", List.of(7)))));
    assertEquals(Map.of(), w.ok("fence_saves", Map.of("request_ids", List.of("never-saved"))));

    assertEquals("unknown_request", PortTestClient.errorCode(c.call("update_state_after_alloc",
        Map.of("request_id", "nope", "block_ids", List.of(1), "num_external_tokens", 0))));
    assertEquals("bad_args", PortTestClient.errorCode(c.call("get_num_new_matched_tokens",
        Map.of("request_id", "r", "num_prompt_tokens", 4, "num_computed_tokens", 0,
            "kv_transfer_params", Map.of("do_remote_decode", "yes")))));
    assertEquals(Map.of("count", 0L, "async", false), c.ok("get_num_new_matched_tokens",
        Map.of("request_id", "r", "num_prompt_tokens", 4, "num_computed_tokens", 0)));

    // A second client with a wrong version is cut off; one with a broken frame too.
    PortTestClient v = client(socket);
    Map<String, Object> badVersion = v.call("hello", Map.of("version", 3, "side", "scheduler"));
    assertEquals("bad_version", PortTestClient.errorCode(badVersion));
    assertTrue(String.valueOf(badVersion).contains("supported: [1, 2]"), String.valueOf(badVersion));
    assertTrue(v.closedByNode());
    PortTestClient b = client(socket);
    b.raw(new byte[] {0, 0, 0, 0});
    assertEquals("bad_frame", PortTestClient.errorCode(b.read()));
    assertTrue(b.closedByNode());
    PortTestClient b2 = client(socket);
    b2.raw(new byte[] {0, 0, 0, 2, (byte) 0x91, 0x01}); // an array, not a map
    assertEquals("bad_frame", PortTestClient.errorCode(b2.read()));

    // The engine's own connections still work.
    assertEquals(Map.of("node", c.ok("ping", Map.of()).get("node")), w.ok("ping", Map.of()));
  }

  @Test
  void aFirstHelloThatFailsLeavesNoEngineBehind() throws Exception {
    Path socket = prefillNode("write,read");
    // A node serving both modes: the first hello names read and fails on its URL. The engine it
    // began is not kept, so it does not fix the node's engine as a READ one.
    PortTestClient c = client(socket);
    assertEquals("bad_args", PortTestClient.errorCode(c.call("hello", Map.of("version", 1,
        "side", "scheduler", "engine", Map.of("mode", "read"), "http_url", "http://[bad"))));
    c.ok("hello", Map.of("version", 1, "side", "scheduler", "engine", Map.of("mode", "write")));
    worker(socket, kvFile(), "write");
  }

  /**
   * Version 2's batch: each element runs as its own one-way frame would, in order, and its error
   * comes back under its op's name with the next build_connector_meta; a bad element is skipped.
   */
  @Test
  void aBatchRunsEachOpInOrderAsOneWayFramesWould() throws Exception {
    Path socket = prefillNode("write");
    PortTestClient s = client(socket);
    assertEquals(2L, s.ok("hello", Map.of("version", 2, "side", "scheduler",
        "engine", Map.of("mode", "write"))).get("version"));
    worker(socket, kvFile(), "write"); // the engine's allocations need its workers
    List<Object> ops = new ArrayList<>();
    for (int i = 0; i < 3; i++) {
      ops.add(List.of("get_num_new_matched_tokens", Map.of("request_id", "r" + i,
          "num_prompt_tokens", 16, "num_computed_tokens", 0)));
    }
    ops.add(List.of("update_state_after_alloc", Map.of("request_id", "nobody",
        "block_ids", List.of(1), "num_external_tokens", 0))); // never named: unknown_request
    ops.add("not an element");
    ops.add(List.of("hello", Map.of("version", 2)));
    ops.add(List.of("request_finished", Map.of("request_id", "r2", "block_ids", List.of(),
        "status", "stopped")));
    s.oneWay("batch", Map.of("ops", ops));
    // The batch's ops ran before this call: r0 and r1 are named, r2 is finished again.
    s.ok("update_state_after_alloc", Map.of("request_id", "r0", "block_ids", List.of(1, 2),
        "num_external_tokens", 0));
    s.ok("update_state_after_alloc", Map.of("request_id", "r1", "block_ids", List.of(3),
        "num_external_tokens", 0));
    assertEquals("unknown_request", PortTestClient.errorCode(s.call("update_state_after_alloc",
        Map.of("request_id", "r2", "block_ids", List.of(4), "num_external_tokens", 0))));
    @SuppressWarnings("unchecked")
    List<Map<String, Object>> opErrors = (List<Map<String, Object>>) s.ok("build_connector_meta",
        Map.of("scheduled_new_reqs", List.of(), "scheduled_cached_reqs", List.of()))
        .get("op_errors");
    assertEquals(List.of("update_state_after_alloc:unknown_request", "batch:bad_args",
            "hello:bad_args"),
        opErrors.stream().map(e -> e.get("op") + ":" + e.get("code")).toList());
    // With an id the batch is answered once every op ran; a batch without ops is fine.
    assertEquals(Map.of(), s.ok("batch", Map.of("ops", List.of())));
    assertEquals("bad_args", PortTestClient.errorCode(s.call("batch", Map.of("ops", 7))));
  }

  /**
   * A process of another uid is refused by its credentials even where the socket's mode would
   * let it connect (here opened to everyone on purpose): one unauthorized frame, then the end.
   */
  @Test
  void anotherUidIsRefused() throws Exception {
    org.junit.jupiter.api.Assumptions.assumeTrue(
        "root".equals(System.getProperty("user.name")), "needs root to run a client as nobody");
    org.junit.jupiter.api.Assumptions.assumeTrue(
        Files.isExecutable(Path.of("/usr/bin/setpriv")), "needs setpriv (util-linux)");
    Path socket = prefillNode("write");
    Files.setPosixFilePermissions(dir, PosixFilePermissions.fromString("rwxr-xr-x"));
    Files.setPosixFilePermissions(socket, PosixFilePermissions.fromString("rw-rw-rw-"));
    String client = "import socket,sys\n"
        + "s=socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); data=b''\n"
        + "while True:\n"
        + "  b=s.recv(4096)\n"
        + "  if not b: break\n"
        + "  data+=b\n"
        + "print('refused' if b'unauthorized' in data else 'served', len(data))\n";
    Process p = new ProcessBuilder("/usr/bin/setpriv", "--reuid=65534", "--regid=65534",
        "--clear-groups", "/usr/bin/python3", "-c", client, socket.toString())
        .redirectErrorStream(true).start();
    assertTrue(p.waitFor(30, java.util.concurrent.TimeUnit.SECONDS), "client hung");
    String out = new String(p.getInputStream().readAllBytes(),
        java.nio.charset.StandardCharsets.UTF_8);
    assertTrue(out.startsWith("refused"), out);
    // The node's own user is still served.
    client(socket).ok("ping", Map.of());
  }

  @Test
  void writeModeMovesPrefillBytesIntoDecodeBlocksAndAnEngineCanComeBack() throws Exception {
    transfer("write");
  }

  @Test
  void readModeMovesPrefillBytesIntoDecodeBlocks() throws Exception {
    transfer("read");
  }

  @Test
  void readModeWithReadsInTheNextStepLoadsThereAndWaitsPerLayer() throws Exception {
    transfer("read", false);
  }

  private void transfer(String mode) throws Exception {
    transfer(mode, true);
  }

  /**
   * One request through two nodes; {@code readsAtAdmission} (READ): D's reads start at
   * update_state_after_alloc (the default), else in the next step's start_load_kv.
   */
  private void transfer(String mode, boolean readsAtAdmission) throws Exception {
    int pPort = FreePorts.next();
    int dPort = FreePorts.next();
    Path pSocket = dir.resolve("p.sock");
    Path dSocket = dir.resolve("d.sock");
    EngineNode p = node("prefill", "p0", mode, pSocket, pPort, pPort);
    EngineNode d = node("decode", "d0", mode, dSocket, dPort, pPort, readsAtAdmission);
    Path pFile = kvFile();
    Path dFile = kvFile();
    MappedByteBuffer pKv = map(pFile);
    MappedByteBuffer dKv = map(dFile);
    PortTestClient pw = worker(pSocket, pFile, mode);
    PortTestClient ps = scheduler(pSocket, mode);
    // D's worker asks for the node's load events in READ mode: host memory has none, so the
    // ring comes back empty and wait_for_layer_load keeps its CPU wait and its reply.
    PortTestClient dw = client(dSocket);
    Map<String, Object> dHello = dw.ok("hello", workerHello(dFile, mode, mode.equals("read")));
    if (mode.equals("read")) {
      assertEquals(List.of(), dHello.get("load_events"));
    } else {
      assertFalse(dHello.containsKey("load_events"), dHello.toString());
    }
    PortTestClient ds = scheduler(dSocket, mode);

    int prompt = 10; // three blocks of four tokens, the last one partly filled
    List<Integer> pBlocks = List.of(1, 2, 3);
    List<Integer> dBlocks = List.of(9, 5, 12);
    Random random = new Random(7);
    for (int l = 0; l < LAYERS; l++) {
      for (int kv = 0; kv < 2; kv++) {
        for (int b : pBlocks) {
          byte[] bytes = new byte[BLOCK_BYTES];
          random.nextBytes(bytes);
          pKv.put(offset(l, kv, b), bytes);
        }
      }
    }
    String r = "req-" + mode;
    Map<String, Object> pParams = Map.of("do_remote_decode", true, "transfer_id", "t-" + mode,
        "remote_engine_id", "d0");
    Map<String, Object> dParams;
    assertEquals(0L, ps.ok("get_num_new_matched_tokens", Map.of("request_id", r,
        "num_prompt_tokens", prompt, "num_computed_tokens", 0, "kv_transfer_params", pParams))
        .get("count"));
    ps.ok("update_state_after_alloc",
        Map.of("request_id", r, "block_ids", pBlocks, "num_external_tokens", 0));
    if (mode.equals("write")) {
      dParams = Map.of("do_remote_prefill", true, "transfer_id", "t-" + mode,
          "remote_engine_id", "p0");
      // A client that answered the engine itself says what it answered; another answer than the
      // node's is refused (one-way, the refusal would come with build_connector_meta).
      Map<String, Object> wrong = ds.call("get_num_new_matched_tokens", Map.of("request_id", r,
          "num_prompt_tokens", prompt, "num_computed_tokens", 0, "kv_transfer_params", dParams,
          "answered", Map.of("count", prompt - 1, "async", true)));
      assertEquals("bad_args", PortTestClient.errorCode(wrong), wrong.toString());
      Map<String, Object> m = ds.ok("get_num_new_matched_tokens", Map.of("request_id", r,
          "num_prompt_tokens", prompt, "num_computed_tokens", 0, "kv_transfer_params", dParams,
          "answered", Map.of("count", prompt, "async", true)));
      assertEquals(Map.of("count", (long) prompt, "async", true), m);
      ds.ok("update_state_after_alloc",
          Map.of("request_id", r, "block_ids", dBlocks, "num_external_tokens", prompt));
      step(ds, dw, List.of(), 0);
    }
    // P's prefill: one step computing all ten tokens; in WRITE mode it saves every layer, and
    // its metadata says so (in READ mode P saves nothing: D reads later).
    step(ps, pw, List.of(Map.of("request_id", r, "block_ids", pBlocks,
        "num_computed_tokens", prompt)), mode.equals("write") ? 1 : 0);
    Map<String, Object> finished = ps.ok("request_finished",
        Map.of("request_id", r, "block_ids", pBlocks, "status", "length_capped"));
    assertEquals(true, finished.get("delay_free"));
    if (mode.equals("read")) {
      // P's next step hands the kept blocks to its workers, which wait for D's release.
      step(ps, pw, List.of(), 0);
      @SuppressWarnings("unchecked")
      Map<String, Object> forD = (Map<String, Object>) finished.get("kv_transfer_params");
      assertEquals(List.of(1L, 2L, 3L), forD.get("remote_block_ids"));
      Map<String, Object> m = ds.ok("get_num_new_matched_tokens", Map.of("request_id", r,
          "num_prompt_tokens", prompt, "num_computed_tokens", 0, "kv_transfer_params", forD));
      assertEquals(Map.of("count", (long) prompt - 1, "async", true), m);
      ds.ok("update_state_after_alloc",
          Map.of("request_id", r, "block_ids", dBlocks, "num_external_tokens", prompt - 1));
      Map<String, Object> loads = step(ds, dw, List.of(Map.of("request_id", r, "block_ids",
          dBlocks, "num_computed_tokens", prompt - 1)), 0);
      // Started at admission, the reads are not this step's: it waits for none of them.
      assertEquals(readsAtAdmission ? 0L : 1L, loads.get("loads"));
      for (int l = 0; l < LAYERS; l++) {
        assertEquals(Map.of("ok", true), dw.ok("wait_for_layer_load", Map.of("layer", l)));
      }
    }
    awaitListed(d, dw, r, "done_receiving");
    awaitListed(p, pw, r, "done_sending");
    for (int l = 0; l < LAYERS; l++) {
      for (int kv = 0; kv < 2; kv++) {
        for (int i = 0; i < pBlocks.size(); i++) {
          assertArrayEquals(bytes(pKv, offset(l, kv, pBlocks.get(i))),
              bytes(dKv, offset(l, kv, dBlocks.get(i))),
              mode + ": layer " + l + (kv == 0 ? " K" : " V") + " block " + i);
        }
      }
    }
    // Blocks P did not lend stay as they were in D (zeros).
    assertArrayEquals(new byte[BLOCK_BYTES], bytes(dKv, offset(0, 0, 1)));

    // The engine process goes (its connections close); the node takes it off its list and
    // serves the next one.
    ps.close();
    pw.close();
    awaitNoEngines(p);
    PortTestClient again = worker(pSocket, pFile, mode);
    again.ok("ping", Map.of());
  }

  /**
   * A prefill client that answered request_finished itself says what it answered: the node
   * finishes the request either way (the engine acted on the answer), and refuses an answer
   * other than its own.
   */
  @Test
  void prefillsRequestFinishedAnsweredByTheClientIsCheckedAfterTheRequestFinished()
      throws Exception {
    Path socket = prefillNode("read");
    Path file = kvFile();
    PortTestClient pw = worker(socket, file, "read");
    PortTestClient ps = scheduler(socket, "read");
    for (String r : List.of("a", "b", "c")) {
      ps.ok("get_num_new_matched_tokens", Map.of("request_id", r, "num_prompt_tokens", 10,
          "num_computed_tokens", 0, "kv_transfer_params", Map.of("do_remote_decode", true,
              "transfer_id", "t-" + r, "remote_engine_id", "d0")));
      ps.ok("update_state_after_alloc",
          Map.of("request_id", r, "block_ids", List.of(1, 2, 3), "num_external_tokens", 0));
    }
    step(ps, pw, List.of(), 0);
    @SuppressWarnings("unchecked")
    Map<String, Object> first = (Map<String, Object>) ps.ok("request_finished",
        Map.of("request_id", "a", "block_ids", List.of(1, 2, 3), "status", "length_capped"))
        .get("kv_transfer_params");
    Map<String, Object> same = new LinkedHashMap<>(first);
    same.put("transfer_id", "t-b");
    same.put("remote_block_ids", List.of(4, 5));
    Map<String, Object> ok = ps.ok("request_finished", Map.of("request_id", "b", "block_ids",
        List.of(4, 5), "status", "length_capped",
        "answered", Map.of("delay_free", true, "kv_transfer_params", same)));
    assertEquals(true, ok.get("delay_free"));
    assertEquals(((Map<?, ?>) ok.get("kv_transfer_params")).get("remote_worker_uids"),
        first.get("remote_worker_uids"));
    Map<String, Object> wrong = new LinkedHashMap<>(same);
    wrong.put("transfer_id", "t-c");
    wrong.put("remote_block_ids", List.of(6));
    wrong.put("remote_engine_id", "p1");
    Map<String, Object> refused = ps.call("request_finished", Map.of("request_id", "c",
        "block_ids", List.of(6), "status", "length_capped",
        "answered", Map.of("delay_free", true, "kv_transfer_params", wrong)));
    assertEquals("bad_args", PortTestClient.errorCode(refused), refused.toString());
    assertTrue(refused.toString().contains("p1"), refused.toString());
    // Finished all the same: the node no longer knows the request.
    Map<String, Object> again = ps.ok("request_finished",
        Map.of("request_id", "c", "block_ids", List.of(6), "status", "length_capped"));
    assertEquals(false, again.get("delay_free"));
    assertNull(again.get("kv_transfer_params"));
  }

  /**
   * A client may name its step in build_connector_meta and hand its own handle to the workers
   * before the node read the build: a bind that comes first waits for the step; counts other than
   * the node's are refused (and a handle carrying them binds nothing); a wrong step number is
   * refused and its binds fail at once rather than wait.
   */
  @Test
  void aStepTheClientNamesIsBoundWhicheverFrameComesFirst() throws Exception {
    int port = FreePorts.next();
    Path socket = dir.resolve("p.sock");
    EngineNode n = node("prefill", "p0", "write", socket, port, port);
    PortTestClient pw = worker(socket, kvFile(), "write");
    PortTestClient ps = client(socket);
    Map<String, Object> hello = ps.ok("hello",
        Map.of("version", 1, "side", "scheduler", "engine", Map.of("mode", "write")));
    assertEquals(true, hello.get("client_steps"), hello.toString());
    assertEquals(true, hello.get("reads_at_admission"), hello.toString());
    ps.ok("get_num_new_matched_tokens", Map.of("request_id", "a", "num_prompt_tokens", 40,
        "num_computed_tokens", 0, "kv_transfer_params", Map.of("do_remote_decode", true,
            "transfer_id", "t-a", "remote_engine_id", "d0")));
    ps.ok("update_state_after_alloc",
        Map.of("request_id", "a", "block_ids", List.of(1, 2, 3), "num_external_tokens", 0));
    // Asked: the node's handle names the engine and the step the client's next ones follow.
    Map<String, Object> first = PortFrames.decodeMap((byte[]) ps.ok("build_connector_meta",
        Map.of("scheduled_new_reqs", List.of(Map.of("request_id", "a", "block_ids",
            List.of(1, 2, 3), "num_computed_tokens", 16)), "scheduled_cached_reqs", List.of()))
        .get("metadata"));
    long engine = ((Number) first.get("engine")).longValue();
    long next = ((Number) first.get("step")).longValue() + 1;
    assertEquals(0L, ((Number) first.get("saves")).longValue(), "not the last chunk yet");

    // The worker's bind of the next step arrives first; its start_load_kv answers once the
    // scheduler's build (a chunk that is not the last: nothing saved) was read.
    pw.oneWay("bind_connector_metadata", Map.of("metadata", handle(engine, next, 0, 0)));
    java.util.concurrent.CompletableFuture<Map<String, Object>> started =
        java.util.concurrent.CompletableFuture.supplyAsync(() -> {
          try {
            return pw.ok("start_load_kv", Map.of());
          } catch (IOException | PortException e) {
            throw new IllegalStateException(e);
          }
        });
    // The bind is the one that waits: the worker's port thread is parked in PortEngine.step.
    probe(n).awaitAssert(Duration.ofSeconds(10), Duration.ofMillis(10), () -> {
      assertTrue(Thread.getAllStackTraces().entrySet().stream().anyMatch(
          t -> t.getKey().getState() == Thread.State.TIMED_WAITING && java.util.Arrays.stream(
              t.getValue()).anyMatch(f -> f.getClassName().equals(PortEngine.class.getName())
                  && f.getMethodName().equals("step"))), "no bind waiting for its step yet");
      return null;
    });
    Map<String, Object> built = ps.ok("build_connector_meta", Map.of("step", next,
        "answered", Map.of("loads", 0, "saves", 0), "scheduled_new_reqs", List.of(),
        "scheduled_cached_reqs", List.of(Map.of("request_id", "a", "num_computed_tokens", 32))));
    assertEquals(List.of(), built.get("op_errors"));
    assertEquals(0L, ((Number) started.get(30, java.util.concurrent.TimeUnit.SECONDS)
        .get("loads")).longValue());
    assertEquals(List.of(), pw.ok("get_finished", Map.of()).get("op_errors"));

    // The last chunk saves: a client that answered no saves is refused, and the worker that
    // binds its handle binds nothing and hears why.
    Map<String, Object> wrong = ps.call("build_connector_meta", Map.of("step", next + 1,
        "answered", Map.of("loads", 0, "saves", 0), "scheduled_new_reqs", List.of(),
        "scheduled_cached_reqs", List.of(Map.of("request_id", "a", "num_computed_tokens", 40))));
    assertEquals("bad_args", PortTestClient.errorCode(wrong), wrong.toString());
    assertTrue(wrong.toString().contains("saves 0; the node's are 0 and 1"), wrong.toString());
    pw.oneWay("bind_connector_metadata", Map.of("metadata", handle(engine, next + 1, 0, 0)));
    assertEquals(0L, ((Number) pw.ok("start_load_kv", Map.of()).get("loads")).longValue());
    List<?> bindErrors = (List<?>) pw.ok("get_finished", Map.of()).get("op_errors");
    assertEquals(1, bindErrors.size(), bindErrors.toString());
    assertTrue(bindErrors.toString().contains("the handle's counts (loads 0, saves 0) are not the"
        + " step's (0, 1)"), bindErrors.toString());

    // A step number out of line is refused; binding it fails at once with the reason, and the
    // number is never given to another step.
    long skipped = next + 5;
    Map<String, Object> outOfLine = ps.call("build_connector_meta", Map.of("step", skipped,
        "answered", Map.of("loads", 0, "saves", 0), "scheduled_new_reqs", List.of(),
        "scheduled_cached_reqs", List.of()));
    assertEquals("bad_args", PortTestClient.errorCode(outOfLine), outOfLine.toString());
    assertTrue(outOfLine.toString().contains("the next step of engine"), outOfLine.toString());
    pw.oneWay("bind_connector_metadata", Map.of("metadata", handle(engine, skipped, 0, 0)));
    pw.ok("start_load_kv", Map.of());
    List<?> refused = (List<?>) pw.ok("get_finished", Map.of()).get("op_errors");
    assertTrue(refused.toString().contains("was refused"), refused.toString());
    Map<String, Object> after = PortFrames.decodeMap((byte[]) ps.ok("build_connector_meta",
        Map.of("scheduled_new_reqs", List.of(), "scheduled_cached_reqs", List.of()))
        .get("metadata"));
    assertEquals(skipped + 1, ((Number) after.get("step")).longValue());
    // An older number named again is refused too, and its handle does not bind the step built
    // under that number before.
    Map<String, Object> older = ps.call("build_connector_meta", Map.of("step", next,
        "answered", Map.of("loads", 0, "saves", 0), "scheduled_new_reqs", List.of(),
        "scheduled_cached_reqs", List.of()));
    assertEquals("bad_args", PortTestClient.errorCode(older), older.toString());
    pw.oneWay("bind_connector_metadata", Map.of("metadata", handle(engine, next, 0, 0)));
    pw.ok("start_load_kv", Map.of());
    List<?> stale = (List<?>) pw.ok("get_finished", Map.of()).get("op_errors");
    assertTrue(stale.toString().contains("was refused"), stale.toString());

    // A step no build names: the bind waits out PortEngine.BIND_WAIT, then binds nothing and
    // says so; the worker's connection serves on.
    pw.oneWay("bind_connector_metadata", Map.of("metadata", handle(engine, skipped + 50, 0, 0)));
    pw.ok("start_load_kv", Map.of());
    List<?> never = (List<?>) pw.ok("get_finished", Map.of()).get("op_errors");
    assertTrue(never.toString().contains("was not built within"), never.toString());
  }

  private static byte[] handle(long engine, long step, int loads, int saves) throws IOException {
    return PortFrames.encode(Map.of("engine", engine, "step", step, "loads", loads,
        "saves", saves));
  }

  /** One engine step: metadata from the scheduler, bound and started by the worker. */
  /**
   * One engine step as the Python client takes it: the save frames go only when the metadata's
   * {@code saves} count says the step saves (it must be {@code expectSaves}), so a transfer that
   * still completes shows that the count leaves nothing out.
   */
  private static Map<String, Object> step(PortTestClient s, PortTestClient w,
      List<Map<String, Object>> newReqs, int expectSaves) throws Exception {
    Map<String, Object> meta = s.ok("build_connector_meta",
        Map.of("scheduled_new_reqs", newReqs, "scheduled_cached_reqs", List.of()));
    byte[] handle = (byte[]) meta.get("metadata");
    long saves = ((Number) PortFrames.decodeMap(handle).get("saves")).longValue();
    assertEquals(expectSaves, saves, "the metadata's saves count");
    w.oneWay("bind_connector_metadata", Map.of("metadata", handle));
    Map<String, Object> started = w.ok("start_load_kv", Map.of());
    if (saves > 0) {
      for (int l = 0; l < LAYERS; l++) {
        w.oneWay("save_kv_layer", Map.of("layer", l));
      }
      w.ok("wait_for_save", Map.of());
    }
    return started;
  }

  /** Polls get_finished (a step with nothing to compute) until {@code request} is under {@code key}. */
  private static void awaitListed(EngineNode n, PortTestClient w, String request, String key) {
    probe(n).awaitAssert(Duration.ofSeconds(20), Duration.ofMillis(20), () -> {
      Map<String, Object> f = w.ok("get_finished", Map.of());
      assertEquals(Map.of(), f.get("failed"), "transfer failed");
      assertEquals(List.of(), f.get("op_errors"));
      assertTrue(((List<?>) f.get(key)).contains(request), request + " not yet in " + key);
      return null;
    });
  }

  private static void awaitNoEngines(EngineNode n) {
    probe(n).awaitAssert(Duration.ofSeconds(30), Duration.ofMillis(20), () -> {
      assertEquals(List.of(), List.copyOf(n.engines()), "engines still attached");
      return null;
    });
    assertFalse(n.workers().iterator().hasNext());
  }

  private static TestProbe<Void> probe(EngineNode n) {
    return TestProbe.create(n.system());
  }

  private static int offset(int layer, int kv, int block) {
    return (int) (layer * LAYER_BYTES + (long) kv * NUM_BLOCKS * BLOCK_BYTES
        + (long) block * BLOCK_BYTES);
  }

  private static byte[] bytes(MappedByteBuffer kv, int offset) {
    byte[] out = new byte[BLOCK_BYTES];
    kv.get(offset, out);
    return out;
  }
}
