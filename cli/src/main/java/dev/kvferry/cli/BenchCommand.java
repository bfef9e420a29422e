package dev.kvferry.cli;

import ch.qos.logback.classic.Level;
import ch.qos.logback.classic.Logger;
import dev.kvferry.bench.BenchReport;
import dev.kvferry.bench.BenchRunner;
import java.io.IOException;
import java.io.PrintStream;
import java.io.PrintWriter;
import java.nio.file.Path;
import java.util.LinkedHashSet;
import java.util.List;
import java.util.Set;
import java.util.concurrent.Callable;
import org.slf4j.LoggerFactory;
import org.jspecify.annotations.Nullable;
import picocli.CommandLine.Command;
import picocli.CommandLine.Model.CommandSpec;
import picocli.CommandLine.Option;
import picocli.CommandLine.Spec;

/**
 * {@code kvferry bench}: kvferry side by side with its peers (DESIGN section 7), measured in one
 * run on this machine, as a table of figures and ratios.
 */
@Command(
    name = "bench",
    mixinStandardHelpOptions = true,
    description = {
      "Measures kvferry and its peers in one run on this machine and prints a table: name, unit,"
          + " kvferry's figure, the peer's, the ratio (higher is better for kvferry) and the goal.",
      "Suites: cma (host transfer vs memcpy_ceiling.c, built with gcc), tcp (vs iperf3), ucx (put"
          + " bandwidth vs ucx_perftest -t ucp_put_bw, same UCX_TLS and sizes), planner"
          + " (vs seed_planner.py), notify (round trip vs seed_notify_rtt.py), e2e (simulated"
          + " engines). Installs nothing: a missing peer tool is named with its Debian package.",
      "Progress goes to stderr. Exit code 0 even when a goal is missed; 1 when a row failed"
          + " (wrong bytes at D, plans that differ, kvferry's side could not run); 2 on bad"
          + " options."
    })
public final class BenchCommand implements Callable<Integer> {

  @Spec CommandSpec spec;

  @Option(names = "--json",
      description = "Also print {\"rows\": [...]} as one JSON line, the last line of stdout.")
  boolean json;

  @Option(names = "--only", split = ",", paramLabel = "SUITE",
      description = "Run only these suites (comma-separated): cma, tcp, ucx, planner, notify, port, e2e.")
  List<String> only;

  @Option(names = "--peers", paramLabel = "DIR",
      description = "A folder with other copies of the peer programs (memcpy_ceiling.c,"
          + " seed_planner.py, seed_notify_rtt.py), e.g. ../shared/peers; default: kvferry's own.")
  @Nullable Path peers;

  @Option(names = "--rounds", defaultValue = "7", paramLabel = "N",
      description = "Timed rounds per host transfer measurement (default: ${DEFAULT-VALUE}).")
  int rounds;

  @Option(names = "--repeats", defaultValue = "3", paramLabel = "N",
      description = "Runs of each host transfer measurement and its peer; the median is"
          + " reported (default: ${DEFAULT-VALUE}).")
  int repeats;

  @Option(names = "--round-trips", defaultValue = "20000", paramLabel = "N",
      description = "Notify round trips timed on each side (default: ${DEFAULT-VALUE}).")
  int roundTrips;

  @Option(names = "--e2e-tokens", defaultValue = "2048", paramLabel = "TOKENS",
      description = "Prompt length of the end-to-end requests (default: ${DEFAULT-VALUE}).")
  int e2eTokens;

  @Option(names = "--e2e-requests", defaultValue = "60", paramLabel = "N",
      description = "End-to-end requests timed (default: ${DEFAULT-VALUE}).")
  int e2eRequests;

  @Option(names = "--chart", paramLabel = "PNG",
      description = "Write a chart of host throughput against prompt length to this PNG.")
  Path chart;

  private final PrintStream progress;

  public BenchCommand() {
    this(System.err);
  }

  BenchCommand(PrintStream progress) {
    this.progress = progress;
  }

  @Override
  public Integer call() throws IOException {
    PrintWriter out = spec.commandLine().getOut();
    PrintWriter err = spec.commandLine().getErr();
    Set<String> suites = new LinkedHashSet<>(only == null ? BenchRunner.SUITES : only);
    for (String s : suites) {
      if (!BenchRunner.SUITES.contains(s)) {
        err.println("kvferry bench: unknown suite '" + s + "'; valid: "
            + String.join(", ", BenchRunner.SUITES));
        err.flush();
        return 2;
      }
    }
    if (rounds < 1 || repeats < 1 || roundTrips < 10 || e2eRequests < 1 || e2eTokens < 1) {
      err.println("kvferry bench: --rounds, --repeats, --e2e-requests and --e2e-tokens must be"
          + " positive, --round-trips at least 10");
      err.flush();
      return 2;
    }
    quietLogs();
    BenchRunner.Options options = BenchRunner.Options.published(suites, peers,
        rounds, repeats, roundTrips, e2eTokens, e2eRequests, chart);
    BenchReport report = new BenchRunner(options, progress).run();
    out.print(report.toTable());
    if (json) {
      out.println(report.toJson());
    }
    out.flush();
    return report.anyFailed() ? 1 : 0;
  }

  /** The bench's actor systems would otherwise log cluster chatter into the table. */
  private static void quietLogs() {
    if (LoggerFactory.getILoggerFactory() instanceof ch.qos.logback.classic.LoggerContext ctx) {
      for (String name : List.of("org.apache.pekko", "org.apache.pekko.cluster.Cluster",
          "dev.kvferry")) {
        Logger l = ctx.getLogger(name);
        l.setLevel(Level.ERROR);
      }
    }
  }
}
