package dev.kvferry.bench;

import org.jspecify.annotations.Nullable;
import java.io.IOException;
import java.io.PrintStream;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.List;
import java.util.Set;
import java.util.stream.Stream;

/** Runs the selected suites in order and collects their rows; progress goes to {@code progress}. */
public final class BenchRunner {

  /** Suite names, in the order they run. */
  public static final List<String> SUITES = List.of("cma", "tcp", "ucx", "planner", "notify", "port", "e2e");

  /**
   * What to run and how long.
   *
   * @param promptTokens prompt lengths of the host transfer rows
   * @param plannerBlocks request sizes of the planner rows
   * @param warmupNanos least warm-up of the planner and of kvferry's notify round trips
   */
  public record Options(
      Set<String> suites, @Nullable Path peersDir, int[] promptTokens, int[] plannerBlocks,
      int rounds, int repeats, int roundTrips, long warmupNanos, int e2eTokens, int e2eRequests,
      Path chart) {

    /** The published sizes and warm-ups ({@code kvferry bench}'s defaults). */
    public static Options published(Set<String> suites, @Nullable Path peersDir, int rounds,
        int repeats, int roundTrips, int e2eTokens, int e2eRequests, Path chart) {
      return new Options(suites, peersDir, Geometry.PROMPT_TOKENS, PlannerSuite.BLOCK_COUNTS,
          rounds, repeats, roundTrips, NotifyRoundTripSuite.WARMUP_NANOS, e2eTokens, e2eRequests,
          chart);
    }
  }

  private final Options options;
  private final PrintStream progress;

  public BenchRunner(Options options, PrintStream progress) {
    this.options = options;
    this.progress = progress;
  }

  public BenchReport run() throws IOException {
    Path work = Files.createTempDirectory("kvferry-bench-");
    try {
      PeerTools peers = new PeerTools(PeerTools.locatePeers(options.peersDir(), work), work);
      List<BenchRow> rows = new ArrayList<>();
      HostTransferSuite host = new HostTransferSuite(
          peers, options.promptTokens(), options.rounds(), options.repeats(), progress);
      if (options.suites().contains("cma")) {
        progress.println("host transfer, cma vs memcpy_ceiling.c");
        rows.addAll(host.cma());
      }
      if (options.suites().contains("tcp")) {
        progress.println("host transfer, tcp vs iperf3");
        rows.addAll(host.tcp());
        progress.println("host transfer, tcp striped over " + HostTransferSuite.TCP_STREAMS
            + " streams vs iperf3 -P " + HostTransferSuite.TCP_STREAMS);
        rows.addAll(host.tcpStreams());
      }
      if (options.suites().contains("ucx")) {
        progress.println("host transfer, ucx put vs ucx_perftest ucp_put_bw");
        rows.addAll(new UcxSuite(options.rounds(), options.repeats(), progress).run());
      }
      if (options.suites().contains("planner")) {
        progress.println("planner vs seed_planner.py");
        rows.addAll(new PlannerSuite(peers, options.plannerBlocks(),
            Math.min(options.warmupNanos(), 2_000_000_000L), progress).run());
      }
      if (options.suites().contains("notify")) {
        progress.println("notify round trip vs seed_notify_rtt.py");
        rows.addAll(new NotifyRoundTripSuite(peers, options.roundTrips(), options.warmupNanos(),
            progress).run());
      }
      if (options.suites().contains("port")) {
        progress.println("engine port (Python client) against 5% of a 10 ms engine step");
        rows.addAll(new EnginePortSuite(Path.of("/usr/bin/python3"), progress).run());
      }
      if (options.suites().contains("e2e")) {
        progress.println("end to end with the simulated engine");
        rows.addAll(
            new EndToEndSuite(options.e2eTokens(), options.e2eRequests(), progress).run());
      }
      if (options.chart() != null && !host.series().isEmpty()) {
        ThroughputChart.write(options.chart(),
            "Host KV transfer P->D: kvferry vs peers, same run", host.promptTokens(),
            host.series());
        progress.println("chart written to " + options.chart());
      }
      return new BenchReport(rows);
    } finally {
      try (Stream<Path> files = Files.walk(work)) {
        files.sorted(Comparator.reverseOrder()).forEach(p -> p.toFile().delete());
      }
    }
  }
}
