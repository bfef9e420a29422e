package dev.kvferry.bench;

import dev.kvferry.bench.host.UcxPutBench;
import dev.kvferry.bench.host.UcxPutBench.Layout;
import dev.kvferry.rdma.ucx.Ucx;
import java.io.IOException;
import java.io.PrintStream;
import java.net.InetSocketAddress;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import org.jspecify.annotations.Nullable;

/**
 * The ucx transport's put bandwidth into another process against {@code ucx_perftest -t
 * ucp_put_bw} (Debian ucx-utils) between two processes on loopback, over the same UCX transport
 * (UCX_TLS) and with the same message sizes, in the same run. Two kvferry figures per size:
 * {@code distinct} blocks (64 MiB of a KV transfer, each byte moved once) and {@code repeated}
 * (one buffer put again and again, ucx_perftest's own pattern); the peer is the same perftest
 * figure for both. ucx_perftest's MB/s are MiB/s (UCS_MBYTE); they are converted to GB/s (1e9).
 *
 * <p>perftest puts one buffer again and again, so at 32 KiB and 1 MiB its copy stays in cache;
 * kvferry's distinct blocks move 64 MiB out of cache. Over shared memory that is the whole gap, so
 * for sm each distinct row has a companion without a goal whose peer is perftest putting one
 * message of the batch's 64 MiB (the same bytes out of cache). Not for tcp: UCX's tcp put of one
 * 64 MiB message is pathologically slow (27 MiB/s seen), which says nothing about kvferry.
 */
public final class UcxSuite {

  /** Goal from DESIGN section 7. */
  public static final double GOAL = 0.9;

  /** The UCX transports measured here: TCP, and shared memory between processes of one host. */
  static final List<String> TRANSPORTS = List.of("tcp", "sm");

  /** Put sizes: one KV block (32 KiB), and 1 MiB as in DESIGN section 12's perftest figure. */
  static final long[] SIZES = {Geometry.BLOCK_BYTES, 1L << 20};

  /** Bytes one kvferry batch moves (distinct layout); also the peer process's region. */
  static final long BATCH_BYTES = 64L << 20;

  private final int rounds;
  private final int repeats;
  private final PrintStream progress;

  public UcxSuite(int rounds, int repeats, PrintStream progress) {
    this.rounds = rounds;
    this.repeats = repeats;
    this.progress = progress;
  }

  public List<BenchRow> run() {
    List<BenchRow> rows = new ArrayList<>();
    String perftest = null;
    String missing = null;
    if (!Ucx.available()) {
      missing = "UCX not available: " + Ucx.unavailableReason();
    } else {
      try {
        perftest = PeerTools.requireCommand("ucx_perftest", "ucx-utils", System.getenv("PATH"));
      } catch (PeerTools.MissingPeerException e) {
        missing = e.getMessage();
      }
    }
    for (String tls : TRANSPORTS) {
      for (long size : SIZES) {
        int count = (int) (BATCH_BYTES / size);
        List<Double> distinct = new ArrayList<>();
        List<Double> repeated = new ArrayList<>();
        List<Double> peer = new ArrayList<>();
        String note = missing != null ? missing : "";
        for (int r = 0; r < repeats && missing == null; r++) {
          progress.printf(Locale.ROOT, "  ucx UCX_TLS=%s, %d puts of %s, run %d of %d%n", tls, count,
              size(size), r + 1, repeats);
          try {
            peer.add(perftestGbps(perftest, tls, size, count * rounds, count));
          } catch (IOException | RuntimeException e) {
            note = "ucx_perftest failed: " + e.getMessage();
          }
          try (UcxPutBench bench = new UcxPutBench(tls, BATCH_BYTES)) {
            UcxPutBench.Result d = bench.run(size, count, rounds, Layout.DISTINCT);
            UcxPutBench.Result p = bench.run(size, count, rounds, Layout.REPEATED);
            if (!d.verified() || !p.verified()) {
              throw new IOException("the bytes at the peer differ from ours after a ucx run");
            }
            distinct.add(d.medianGbps());
            repeated.add(p.medianGbps());
          } catch (IOException | RuntimeException e) {
            note = "kvferry ucx failed: " + e.getMessage();
            break;
          }
        }
        Double peerGbps = peer.isEmpty() ? null : Samples.median(peer);
        rows.add(BenchRow.higherIsBetter(
            "ucx put " + tls + " " + size(size) + " x" + count + " distinct blocks", "GB/s",
            distinct.isEmpty() ? null : Samples.median(distinct), peerGbps, GOAL, note));
        rows.add(BenchRow.higherIsBetter(
            "ucx put " + tls + " " + size(size) + " x" + count + " one buffer repeated", "GB/s",
            repeated.isEmpty() ? null : Samples.median(repeated), peerGbps, GOAL, note));
        if (tls.equals("sm")) {
          rows.add(sameFootprint(perftest, tls, size, count, distinct, missing));
        }
      }
    }
    return rows;
  }

  /**
   * kvferry's distinct figure beside perftest putting the batch's bytes as one message, so both
   * copy 64 MiB out of cache: the distinct row without the cache's advantage. No goal.
   */
  private BenchRow sameFootprint(@Nullable String perftest, String tls, long size, int count,
      List<Double> distinct, @Nullable String missing) {
    String name = "ucx put " + tls + " " + size(size) + " x" + count
        + " distinct blocks, peer one 64 MiB put";
    if (missing != null) {
      return BenchRow.figure(name, "GB/s", null, missing);
    }
    List<Double> peer = new ArrayList<>();
    String note = "peer: ucx_perftest -s " + BATCH_BYTES + " (the batch's bytes, out of cache)";
    for (int r = 0; r < repeats; r++) {
      try {
        peer.add(perftestGbps(perftest, tls, BATCH_BYTES, rounds, 3));
      } catch (IOException | RuntimeException e) {
        note = "ucx_perftest failed: " + e.getMessage();
      }
    }
    return BenchRow.higherIsBetter(name, "GB/s",
        distinct.isEmpty() ? null : Samples.median(distinct),
        peer.isEmpty() ? null : Samples.median(peer), null, note);
  }

  /**
   * One ucx_perftest put_bw run between two processes on loopback: a server, then a client that
   * does {@code iterations} puts of {@code size} after {@code warmup}; the client's overall
   * bandwidth of its "Final:" line, in GB/s.
   */
  static double perftestGbps(String perftest, String tls, long size, int iterations, int warmup)
      throws IOException {
    int port = dev.kvferry.node.FreePorts.next();
    ProcessBuilder server = new ProcessBuilder(perftest, "-p", String.valueOf(port))
        .redirectOutput(ProcessBuilder.Redirect.DISCARD)
        .redirectError(ProcessBuilder.Redirect.DISCARD);
    server.environment().putAll(Map.of("UCX_TLS", tls));
    Process s = server.start();
    try {
      awaitListening(port, Duration.ofSeconds(20));
      PeerTools.Output o = PeerTools.run(
          List.of("env", "UCX_TLS=" + tls, perftest, "127.0.0.1", "-p", String.valueOf(port),
              "-t", "ucp_put_bw", "-s", String.valueOf(size), "-n", String.valueOf(iterations),
              "-w", String.valueOf(warmup)),
          null, Duration.ofMinutes(5));
      for (String line : o.stdout().split("\\R")) {
        if (line.startsWith("Final:")) {
          String[] w = line.trim().split("\\s+");
          // Final: iterations, 50%ile, average, overall latency (us), average, overall MB/s, ...
          return Double.parseDouble(w[6]) * (1 << 20) / 1e9;
        }
      }
      throw new IOException("ucx_perftest printed no Final: line (exit " + o.exitCode() + "): "
          + o.stderr().strip());
    } finally {
      s.destroy();
    }
  }

  /** Waits until the perftest server accepts on its port (its out-of-band connection). */
  private static void awaitListening(int port, Duration timeout) throws IOException {
    long deadline = System.nanoTime() + timeout.toNanos();
    while (true) {
      // A probe connection would be taken as the client: look at the listening sockets instead.
      if (listening(port)) {
        return;
      }
      if (System.nanoTime() > deadline) {
        throw new IOException("ucx_perftest server did not listen on port " + port + " within "
            + timeout);
      }
      try {
        Thread.sleep(50);
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
        throw new IOException("interrupted", e);
      }
    }
  }

  /** Whether some process listens on TCP {@code port} (a bind of it fails). */
  private static boolean listening(int port) {
    try (java.net.ServerSocket probe = new java.net.ServerSocket()) {
      probe.setReuseAddress(true);
      probe.bind(new InetSocketAddress("0.0.0.0", port));
      return false;
    } catch (IOException bound) {
      return true;
    }
  }

  private static String size(long bytes) {
    return bytes >= (1 << 20) ? (bytes >> 20) + " MiB" : (bytes >> 10) + " KiB";
  }
}
