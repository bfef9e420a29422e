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
 * memcpy of the same bytes in one process (shared/peers/memcpy_ceiling.c, compiled here), and the
 * {@code tcp} transport against an iperf3 single stream on loopback. Each figure is the median of
 * {@code repeats} runs, each itself a median over rounds (see {@link HostTransferBench}).
 */
public final class HostTransferSuite {

  /** Goals from DESIGN section 7. */
  public static final double CMA_CONTIGUOUS_GOAL = 0.9;
  public static final double CMA_SCATTERED_GOAL = 0.7;
  public static final double TCP_GOAL = 0.9;

  private static final ObjectMapper JSON = new ObjectMapper();

  private final PeerTools peers;
  private final int rounds;
  private final int repeats;
  private final PrintStream progress;
  /** Series for the chart: label to GB/s per prompt length (null where not measured). */
  private final Map<String, Double[]> series = new LinkedHashMap<>();

  public HostTransferSuite(PeerTools peers, int rounds, int repeats, PrintStream progress) {
    this.peers = peers;
    this.rounds = rounds;
    this.repeats = repeats;
    this.progress = progress;
  }

  /** GB/s by series and prompt length ({@link Geometry#PROMPT_TOKENS}), for the chart. */
  public Map<String, Double[]> series() {
    return series;
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
    int sizes = Geometry.PROMPT_TOKENS.length;
    for (int s = 0; s < sizes; s++) {
      int tokens = Geometry.PROMPT_TOKENS[s];
      int blocks = Geometry.transferBlocks(tokens);
      List<Double> kvContig = new ArrayList<>();
      List<Double> kvScatter = new ArrayList<>();
      List<Double> ceilContig = new ArrayList<>();
      List<Double> ceilScatter = new ArrayList<>();
      String failure = null;
      for (int r = 0; r < repeats; r++) {
        progress.printf("  cma %s (%d blocks of 32 KiB), run %d of %d%n",
            Geometry.tokens(tokens), blocks, r + 1, repeats);
        if (memcpy != null) {
          try {
            PeerTools.Output o = PeerTools.run(
                List.of(memcpy.toString(), String.valueOf(Geometry.BLOCK_BYTES),
                    String.valueOf(blocks), String.valueOf(rounds)), null, Duration.ofMinutes(5));
            JsonNode j = JSON.readTree(o.lastLine());
            ceilContig.add(j.get("contiguous_gbps").asDouble());
            ceilScatter.add(j.get("scattered_gbps").asDouble());
          } catch (IOException | RuntimeException e) {
            missing = "memcpy_ceiling failed: " + e.getMessage();
          }
        }
        try {
          kvContig.add(cmaGbps(blocks, Layout.CONTIGUOUS));
          kvScatter.add(cmaGbps(blocks, Layout.SCATTERED));
        } catch (IOException | RuntimeException e) {
          failure = "kvferry cma failed: " + e.getMessage();
          break;
        }
      }
      Double kc = kvContig.isEmpty() ? null : Samples.median(kvContig);
      Double ks = kvScatter.isEmpty() ? null : Samples.median(kvScatter);
      Double pc = ceilContig.isEmpty() ? null : Samples.median(ceilContig);
      Double ps = ceilScatter.isEmpty() ? null : Samples.median(ceilScatter);
      String note = failure != null ? failure : missing != null ? missing : "";
      rows.add(BenchRow.higherIsBetter("host P->D cma contiguous " + Geometry.tokens(tokens),
          "GB/s", kc, pc, CMA_CONTIGUOUS_GOAL, note));
      rows.add(BenchRow.higherIsBetter("host P->D cma scattered " + Geometry.tokens(tokens),
          "GB/s", ks, ps, CMA_SCATTERED_GOAL, note));
      put("kvferry cma contiguous", s, kc);
      put("kvferry cma scattered", s, ks);
      put("memcpy contiguous (peer)", s, pc);
      put("memcpy scattered (peer)", s, ps);
    }
    return rows;
  }

  /** Rows for tcp (contiguous 32 KiB blocks) at every prompt length, against one iperf3 figure. */
  public List<BenchRow> tcp() {
    List<BenchRow> rows = new ArrayList<>();
    Double iperf = null;
    String note = "";
    try {
      String iperf3 = peers.iperf3();
      List<Double> runs = new ArrayList<>();
      for (int r = 0; r < repeats; r++) {
        progress.printf("  iperf3 single stream on loopback, run %d of %d%n", r + 1, repeats);
        runs.add(iperf3Gbps(iperf3));
      }
      iperf = Samples.median(runs);
    } catch (PeerTools.MissingPeerException e) {
      note = e.getMessage();
    } catch (IOException | RuntimeException e) {
      note = "iperf3 failed: " + e.getMessage();
    }
    for (int s = 0; s < Geometry.PROMPT_TOKENS.length; s++) {
      int tokens = Geometry.PROMPT_TOKENS[s];
      int blocks = Geometry.transferBlocks(tokens);
      List<Double> runs = new ArrayList<>();
      String rowNote = note;
      for (int r = 0; r < repeats; r++) {
        progress.printf("  tcp %s, run %d of %d%n", Geometry.tokens(tokens), r + 1, repeats);
        try {
          runs.add(HostTransferBench.run(new HostTransferBench.Config(
              Geometry.BLOCK_BYTES, blocks, rounds, "tcp", Layout.CONTIGUOUS)).medianGbps());
        } catch (IOException | RuntimeException e) {
          rowNote = "kvferry tcp failed: " + e.getMessage();
          break;
        }
      }
      Double kv = runs.isEmpty() ? null : Samples.median(runs);
      rows.add(BenchRow.higherIsBetter("host P->D tcp loopback " + Geometry.tokens(tokens),
          "GB/s", kv, iperf, TCP_GOAL, rowNote));
      put("kvferry tcp", s, kv);
      put("iperf3 single stream (peer)", s, iperf);
    }
    return rows;
  }

  private double cmaGbps(int blocks, Layout layout) throws IOException {
    HostTransferBench.Result r = HostTransferBench.run(
        new HostTransferBench.Config(Geometry.BLOCK_BYTES, blocks, rounds, "cma", layout));
    if (!r.verified()) {
      throw new IOException("the bytes at D differ from P's after a cma " + layout + " run");
    }
    return r.medianGbps();
  }

  /** One iperf3 client run of 3 s (the first second omitted) against a one-shot server. */
  private static double iperf3Gbps(String iperf3) throws IOException {
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
              "-J"), null, Duration.ofSeconds(60));
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
    series.computeIfAbsent(label, k -> new Double[Geometry.PROMPT_TOKENS.length])[sizeIndex] = value;
  }
}
