package dev.kvferry.bench;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import dev.kvferry.bench.host.HostTransferBench;
import dev.kvferry.bench.host.HostTransferBench.Layout;
import java.io.IOException;
import java.io.PrintStream;
import java.net.InetSocketAddress;
import java.net.ServerSocket;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/**
 * Host bytes from P to D in another process: the {@code cma} transport against a single-thread
 * memcpy of the same bytes in one process (kvferry's memcpy_ceiling.c, compiled here), and the
 * {@code tcp} transport against an iperf3 single stream on loopback. Each figure is the median of
 * {@code repeats} runs, each itself a median over rounds (see {@link HostTransferBench}). A row
 * whose bytes at D are wrong after its timed rounds fails, whatever its speed.
 */
public final class HostTransferSuite {

  /** Goals from DESIGN section 7. */
  public static final double CMA_CONTIGUOUS_GOAL = 0.95;
  public static final double CMA_SCATTERED_GOAL = 0.9;
  public static final double TCP_GOAL = 1.0;
  /** Streams of the multi-stream tcp rows, against iperf3 -P of the same count. */
  public static final int TCP_STREAMS = 2;

  /** What a scattered row moves, for its note. */
  static final String SCATTERED_NOTE =
      "kvferry: n random block ids out of a pool of 2n on both sides";

  private static final ObjectMapper JSON = new ObjectMapper();

  private final PeerTools peers;
  private final int[] promptTokens;
  private final int rounds;
  private final int repeats;
  private final PrintStream progress;
  /** Series for the chart: label to GB/s per prompt length (null where not measured). */
  private final Map<String, Double[]> series = new LinkedHashMap<>();

  /**
   * @param promptTokens the prompt lengths every row is measured at ({@link
   *     Geometry#PROMPT_TOKENS} for the published figures)
   */
  public HostTransferSuite(
      PeerTools peers, int[] promptTokens, int rounds, int repeats, PrintStream progress) {
    this.peers = peers;
    this.promptTokens = promptTokens.clone();
    this.rounds = rounds;
    this.repeats = repeats;
    this.progress = progress;
  }

  /** GB/s by series and prompt length (the constructor's {@code promptTokens}), for the chart. */
  public Map<String, Double[]> series() {
    return series;
  }

  public int[] promptTokens() {
    return promptTokens.clone();
  }

  /** Rows for cma (contiguous and scattered) at every prompt length. */
  public List<BenchRow> cma() {
    List<BenchRow> rows = new ArrayList<>();
    Path memcpy = null;
    String missing = null;
    try {
      memcpy = peers.memcpyCeiling();
    } catch (PeerTools.MissingPeerException e) {
      missing = e.getMessage();
    } catch (IOException e) {
      missing = "memcpy_ceiling could not be built: " + e.getMessage();
    }
    for (int s = 0; s < promptTokens.length; s++) {
      int tokens = promptTokens[s];
      int blocks = Geometry.transferBlocks(tokens);
      Measured contiguous = new Measured();
      Measured scattered = new Measured();
      // The fallback for regions it cannot map (an engine's own /dev/shm file), for the record.
      Measured syscalls = new Measured();
      List<Double> ceilContig = new ArrayList<>();
      List<Double> ceilScatter = new ArrayList<>();
      for (int r = 0; r < repeats; r++) {
        progress.printf("  cma %s (%d blocks of 32 KiB), run %d of %d%n",
            Geometry.tokens(tokens), blocks, r + 1, repeats);
        if (memcpy != null) {
          try {
            PeerTools.Output o = PeerTools.run(
                // The same work as kvferry's scattered row: n of a pool of 2n blocks, both sides.
                List.of(memcpy.toString(), String.valueOf(Geometry.BLOCK_BYTES),
                    String.valueOf(blocks), String.valueOf(rounds), String.valueOf(2 * blocks)),
                null, Duration.ofMinutes(5));
            JsonNode j = JSON.readTree(o.lastLine());
            ceilContig.add(j.get("contiguous_gbps").asDouble());
            ceilScatter.add(j.get("scattered_gbps").asDouble());
          } catch (IOException | RuntimeException e) {
            missing = "memcpy_ceiling failed: " + e.getMessage();
          }
        }
        contiguous.add("cma", blocks, Layout.CONTIGUOUS);
        scattered.add("cma", blocks, Layout.SCATTERED);
        syscalls.add(new HostTransferBench.Config(Geometry.BLOCK_BYTES, blocks, rounds, "cma",
            Layout.CONTIGUOUS).withCmaMapPeerPages(false));
      }
      Double pc = ceilContig.isEmpty() ? null : Samples.median(ceilContig);
      Double ps = ceilScatter.isEmpty() ? null : Samples.median(ceilScatter);
      String peerNote = missing != null ? missing : "";
      rows.add(contiguous.row(BenchRow.higherIsBetter(
          "host P->D cma contiguous " + Geometry.tokens(tokens), "GB/s", contiguous.median(), pc,
          CMA_CONTIGUOUS_GOAL, peerNote)));
      rows.add(scattered.row(BenchRow.higherIsBetter(
          "host P->D cma scattered " + Geometry.tokens(tokens), "GB/s", scattered.median(), ps,
          CMA_SCATTERED_GOAL, join(peerNote, SCATTERED_NOTE + "; memcpy_ceiling: n random ids of"
              + " a pool of 2n on both sides too, one memcpy per block"))));
      rows.add(syscalls.row(BenchRow.higherIsBetter(
          "host P->D cma contiguous " + Geometry.tokens(tokens) + ", process_vm_writev", "GB/s",
          syscalls.median(), pc, null, join(peerNote, "the fallback where a region cannot be"
              + " mapped (kvferry.node.cma.map-peer-pages off, or an engine's own file); no goal"))));
      put("kvferry cma contiguous", s, contiguous.median());
      put("kvferry cma scattered", s, scattered.median());
      put("memcpy contiguous (peer)", s, pc);
      put("memcpy scattered (peer)", s, ps);
    }
    return rows;
  }

  /**
   * Rows for tcp (contiguous and scattered 32 KiB blocks) at every prompt length, each against
   * iperf3 run beside it: one iperf3 run before each of the row's runs, so the peer's figure (their
   * median) comes from the same minutes as kvferry's. On this project's VM loopback moved 2-3x
   * within minutes (docs/performance.md), more than the goal's margin.
   */
  public List<BenchRow> tcp() {
    List<BenchRow> rows = new ArrayList<>();
    for (int s = 0; s < promptTokens.length; s++) {
      int tokens = promptTokens[s];
      int blocks = Geometry.transferBlocks(tokens);
      Measured contiguous = new Measured();
      Measured scattered = new Measured();
      PeerBeside peer = new PeerBeside(1);
      for (int r = 0; r < repeats; r++) {
        progress.printf("  tcp %s, run %d of %d%n", Geometry.tokens(tokens), r + 1, repeats);
        peer.run();
        contiguous.add("tcp", blocks, Layout.CONTIGUOUS);
        scattered.add("tcp", blocks, Layout.SCATTERED);
      }
      Double iperf = peer.median();
      rows.add(contiguous.row(BenchRow.higherIsBetter(
          "host P->D tcp loopback contiguous " + Geometry.tokens(tokens), "GB/s",
          contiguous.median(), iperf, TCP_GOAL, peer.note())));
      rows.add(scattered.row(BenchRow.higherIsBetter(
          "host P->D tcp loopback scattered " + Geometry.tokens(tokens), "GB/s",
          scattered.median(), iperf, TCP_GOAL, join(peer.note(), SCATTERED_NOTE))));
      put("kvferry tcp contiguous", s, contiguous.median());
      put("kvferry tcp scattered", s, scattered.median());
      put("iperf3 single stream (peer)", s, iperf);
    }
    return rows;
  }

  /**
   * Rows for tcp with each batch striped over {@link #TCP_STREAMS} connections (contiguous 32 KiB
   * blocks) at every prompt length, each against iperf3 with as many parallel streams run beside
   * it (as in {@link #tcp()}).
   */
  public List<BenchRow> tcpStreams() {
    List<BenchRow> rows = new ArrayList<>();
    for (int s = 0; s < promptTokens.length; s++) {
      int tokens = promptTokens[s];
      int blocks = Geometry.transferBlocks(tokens);
      Measured striped = new Measured();
      PeerBeside peer = new PeerBeside(TCP_STREAMS);
      for (int r = 0; r < repeats; r++) {
        progress.printf("  tcp %s, %d streams, run %d of %d%n", Geometry.tokens(tokens),
            TCP_STREAMS, r + 1, repeats);
        peer.run();
        striped.add(new HostTransferBench.Config(Geometry.BLOCK_BYTES, blocks, rounds, "tcp",
            Layout.CONTIGUOUS).withTcpStreams(TCP_STREAMS));
      }
      Double iperf = peer.median();
      rows.add(striped.row(BenchRow.higherIsBetter(
          "host P->D tcp loopback contiguous " + Geometry.tokens(tokens) + ", " + TCP_STREAMS
              + " streams", "GB/s", striped.median(), iperf, TCP_GOAL,
          join(peer.note(), "batches under "
              + (dev.kvferry.rdma.TcpTransport.MIN_STRIPE_BYTES >> 20) + " MiB go on one stream"))));
      put("kvferry tcp contiguous, " + TCP_STREAMS + " streams", s, striped.median());
      put("iperf3 -P " + TCP_STREAMS + " (peer)", s, iperf);
    }
    return rows;
  }

  /**
   * One row's iperf3 runs, each just before one of kvferry's; its figure is their median. A
   * missing tool or a failed run leaves the figure null and says why in the row's note.
   */
  private final class PeerBeside {
    private final int parallel;
    private final List<Double> runs = new ArrayList<>();
    private String why = "";

    PeerBeside(int parallel) {
      this.parallel = parallel;
    }

    void run() {
      if (!why.isEmpty()) {
        return; // missing or failed once: the row goes without the peer
      }
      try {
        String iperf3 = peers.iperf3();
        progress.printf("    iperf3 -P %d on loopback%n", parallel);
        runs.add(iperf3Gbps(iperf3, parallel));
        progress.printf(java.util.Locale.ROOT, "    iperf3: %.3f GB/s%n", runs.get(runs.size() - 1));
      } catch (PeerTools.MissingPeerException e) {
        why = String.valueOf(e.getMessage());
      } catch (IOException | RuntimeException e) {
        why = "iperf3 failed: " + e.getMessage();
      }
    }

    Double median() {
      return why.isEmpty() && !runs.isEmpty() ? Samples.median(runs) : null;
    }

    String note() {
      return why.isEmpty() ? "peer: iperf3" + (parallel > 1 ? " -P " + parallel : "")
          + ", one run before each of this row's (median of " + runs.size() + ")" : why;
    }
  }

  /** kvferry's runs of one row; the first failure (wrong bytes, an error) ends them. */
  private final class Measured {
    private final List<Double> gbps = new ArrayList<>();
    /** How the runs' bytes moved (HostTransferBench.Result#copyPath), in the row's note. */
    private final java.util.Set<String> copyPaths = new java.util.TreeSet<>();
    private String failure;

    void add(String transport, int blocks, Layout layout) {
      add(new HostTransferBench.Config(Geometry.BLOCK_BYTES, blocks, rounds, transport, layout));
    }

    void add(HostTransferBench.Config config) {
      if (failure != null) {
        return;
      }
      String transport = config.transport();
      try {
        HostTransferBench.Result r = HostTransferBench.run(config);
        if (!r.verified()) {
          failure = "the bytes at D differ from P's after the timed rounds of a " + transport + " "
              + config.layout().name().toLowerCase(java.util.Locale.ROOT) + " run";
        } else {
          gbps.add(r.medianGbps());
          copyPaths.add(r.copyPath());
          // Each run's figure in the progress, so a row's spread is on record beside its median.
          progress.printf(java.util.Locale.ROOT, "    kvferry %s %s: %.3f GB/s%n", transport,
              config.layout().name().toLowerCase(java.util.Locale.ROOT), r.medianGbps());
        }
      } catch (IOException | RuntimeException e) {
        failure = "kvferry " + transport + " failed: " + e.getMessage();
      }
    }

    /** The median of the verified runs, or null when a run failed. */
    Double median() {
      return failure != null || gbps.isEmpty() ? null : Samples.median(gbps);
    }

    BenchRow row(BenchRow measured) {
      BenchRow row = copyPaths.isEmpty() ? measured : measured.withNote(
          join(measured.note(), "copy path: " + String.join(", ", copyPaths)));
      return failure == null ? row : row.failedBecause(failure);
    }
  }

  private static String join(String a, String b) {
    return a.isEmpty() ? b : b.isEmpty() ? a : a + "; " + b;
  }

  /**
   * One iperf3 client run of 3 s (the first second omitted) with {@code parallel} streams
   * against a one-shot server; the sum over the streams.
   */
  private static double iperf3Gbps(String iperf3, int parallel) throws IOException {
    int port = dev.kvferry.node.FreePorts.next();
    Process server = new ProcessBuilder(iperf3, "-s", "-1", "-p", String.valueOf(port),
        "-B", "127.0.0.1")
        .redirectOutput(ProcessBuilder.Redirect.DISCARD)
        .redirectError(ProcessBuilder.Redirect.DISCARD)
        .start();
    try {
      awaitListening(port, Duration.ofSeconds(10));
      PeerTools.Output o = PeerTools.run(
          List.of(iperf3, "-c", "127.0.0.1", "-p", String.valueOf(port), "-t", "3", "-O", "1",
              "-P", String.valueOf(parallel), "-J"), null, Duration.ofSeconds(60));
      JsonNode j = JSON.readTree(o.stdout());
      if (j.has("error")) {
        throw new IOException(j.get("error").asText());
      }
      return j.path("end").path("sum_received").path("bits_per_second").asDouble() / 8e9;
    } finally {
      server.destroy();
    }
  }

  /** Waits until the server holds the port (binding it ourselves fails), without connecting. */
  private static void awaitListening(int port, Duration timeout) throws IOException {
    long deadline = System.nanoTime() + timeout.toNanos();
    while (true) {
      try (ServerSocket probe = new ServerSocket()) {
        probe.setReuseAddress(true);
        probe.bind(new InetSocketAddress("127.0.0.1", port));
      } catch (IOException bound) {
        return; // the server holds the port
      }
      if (System.nanoTime() > deadline) {
        throw new IOException("iperf3 server did not listen on port " + port + " within " + timeout);
      }
      try {
        Thread.sleep(50);
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
        throw new IOException("interrupted", e);
      }
    }
  }

  private void put(String label, int sizeIndex, Double value) {
    series.computeIfAbsent(label, k -> new Double[promptTokens.length])[sizeIndex] = value;
  }
}
