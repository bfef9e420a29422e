package dev.kvferry.bench;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assumptions.assumeTrue;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import dev.kvferry.bench.host.HostTransferBench;
import dev.kvferry.bench.host.HostTransferBench.Layout;
import java.io.ByteArrayOutputStream;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.LinkedHashSet;
import java.util.List;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * Every suite of {@code kvferry bench} once at a tiny size, so a suite that breaks (wrong bytes,
 * plans that differ, a crash) cannot land: the published runs are far too long for CI.
 */
class BenchSuitesTest {

  private static final int[] TINY_PROMPT = {16};
  private static final int[] TINY_PLANNER = {16};

  /**
   * Every suite but {@code port}: its node is a {@code kvferry} child process, whose command (the
   * cli module) is not on this module's class path; tests/EnginePortSuiteTest runs it.
   */
  private static LinkedHashSet<String> suitesButPort() {
    LinkedHashSet<String> s = new LinkedHashSet<>(BenchRunner.SUITES);
    s.remove("port");
    return s;
  }

  @Test
  void everySuiteRunsAtATinySizeWithNoFailedRowAndAFigureInEveryRow() throws Exception {
    Path peersDir = sharedPeers();
    ByteArrayOutputStream progress = new ByteArrayOutputStream();
    BenchRunner.Options options = new BenchRunner.Options(
        suitesButPort(), peersDir, TINY_PROMPT, TINY_PLANNER, 1, 1, 200,
        200_000_000L, 64, 2, null);
    BenchReport report =
        new BenchRunner(options, new PrintStream(progress, true, StandardCharsets.UTF_8)).run();

    List<String> names = report.rows().stream().map(BenchRow::name).toList();
    assertEquals(List.of(
        "host P->D cma contiguous 16 tok", "host P->D cma scattered 16 tok",
        "host P->D cma contiguous 16 tok, process_vm_writev",
        "host P->D tcp loopback contiguous 16 tok", "host P->D tcp loopback scattered 16 tok",
        "host P->D tcp loopback contiguous 16 tok, 2 streams",
        "ucx put tcp 32 KiB x2048 distinct blocks", "ucx put tcp 32 KiB x2048 one buffer repeated",
        "ucx put tcp 1 MiB x64 distinct blocks", "ucx put tcp 1 MiB x64 one buffer repeated",
        "ucx put sm 32 KiB x2048 distinct blocks", "ucx put sm 32 KiB x2048 one buffer repeated",
        "ucx put sm 32 KiB x2048 distinct blocks, peer one 64 MiB put",
        "ucx put sm 1 MiB x64 distinct blocks", "ucx put sm 1 MiB x64 one buffer repeated",
        "ucx put sm 1 MiB x64 distinct blocks, peer one 64 MiB put",
        "planner 16 blocks", "notify round trip p50", "notify round trip p99",
        "e2e last layer -> D done p50 64 tok", "e2e last layer -> D done p99 64 tok",
        "e2e last layer -> D done p50 64 tok, 2 ms layers",
        "e2e last layer -> D done p99 64 tok, 2 ms layers",
        "e2e heap per request, kvferry threads", "e2e heap per request, all threads"), names);
    // UCX's rows have figures where libucp is installed (CI installs libucx0 and ucx-utils).
    boolean ucx = dev.kvferry.rdma.ucx.Ucx.available();
    for (BenchRow r : report.rows()) {
      assertFalse(r.failed(), r.name() + " failed: " + r.note());
      if (!ucx && r.name().startsWith("ucx ")) {
        continue;
      }
      assertNotNull(r.kvferry(), r.name() + " has no kvferry figure: " + r.note());
      assertTrue(r.kvferry() > 0, r.name() + ": " + r.kvferry());
    }
    // A peer column is filled exactly where the peer's tool is here (CI installs them all).
    PeerTools tools = new PeerTools(peersDir, Files.createTempDirectory("bench-test-"));
    boolean gcc = available(() -> tools.memcpyCeiling());
    boolean iperf3 = available(tools::iperf3);
    boolean numpy = available(tools::pythonWithNumpy);
    boolean zmq = available(tools::pythonWithZmq);
    boolean perftest = ucx && available(
        () -> PeerTools.requireCommand("ucx_perftest", "ucx-utils", System.getenv("PATH")));
    for (BenchRow r : report.rows()) {
      Boolean expected = r.name().startsWith("host P->D cma") ? gcc
          : r.name().startsWith("host P->D tcp") ? iperf3
          : r.name().startsWith("planner") ? numpy
          : r.name().startsWith("notify") ? zmq
          : r.name().startsWith("ucx ") ? perftest
          : r.name().startsWith("e2e last layer") ? Boolean.TRUE : Boolean.FALSE;
      assertEquals(expected, r.peer() != null, r.name() + ": peer " + r.peer() + "; " + r.note());
    }
    // Each cma row moved its bytes the way its name says.
    for (BenchRow r : report.rows()) {
      if (r.name().startsWith("host P->D cma")) {
        String path = r.name().endsWith("process_vm_writev") ? "syscalls" : "mapped";
        assertTrue(r.note().contains("copy path: " + path), r.name() + ": " + r.note());
      }
    }
    JsonNode json = new ObjectMapper().readTree(report.toJson());
    assertEquals(names.size(), json.get("rows").size());
    assertFalse(json.get("rows").get(0).get("failed").asBoolean());
  }

  @Test
  void aPlannerRowWhosePlanDiffersFromTheSeedsFails(@TempDir Path fakePeers) throws Exception {
    PeerTools real = new PeerTools(fakePeers, fakePeers);
    assumeTrue(available(real::pythonWithNumpy), "no python3 with numpy here");
    // A seed that answers every request with one 4-byte copy: a plan kvferry cannot match.
    Files.writeString(fakePeers.resolve("seed_planner.py"), String.join("\n",
        "import sys, json",
        "sys.stdin.read()",
        "print(json.dumps({'local_offsets': [0], 'remote_offsets': [0], 'sizes': [4],",
        "                  'seconds_per_call': 1.0}))", ""));
    List<BenchRow> rows = new PlannerSuite(real, TINY_PLANNER, 1_000_000L,
        new PrintStream(new ByteArrayOutputStream(), true, StandardCharsets.UTF_8)).run();
    BenchRow row = rows.get(0);
    assertTrue(row.failed(), row.toString());
    assertEquals(Boolean.FALSE, row.meetsGoal(), "a ratio far above the goal must not pass");
    assertTrue(row.note().startsWith("the seed's plan differs from kvferry's"), row.note());
    assertTrue(new BenchReport(rows).toTable().contains("FAILED"));
  }

  @Test
  void scatteredTransfersTakeIdsOutOfTwiceTheirCountOnBothSidesAndVerifyAfterTheTimedRounds()
      throws Exception {
    int blocks = 256;
    HostTransferBench.Result scattered = HostTransferBench.run(
        new HostTransferBench.Config(4096, blocks, 1, "cma", Layout.SCATTERED));
    HostTransferBench.Result contiguous = HostTransferBench.run(
        new HostTransferBench.Config(4096, blocks, 1, "cma", Layout.CONTIGUOUS));
    assertTrue(scattered.verified() && contiguous.verified());
    assertEquals(2 * blocks, scattered.config().poolBlocks());
    assertEquals(1, contiguous.destinationRuns());
    // n ids out of 2n leave about n/2 runs on each side; an exact shuffle of n would leave 1.
    assertTrue(scattered.destinationRuns() > blocks / 4, scattered.toJson());
    assertTrue(scattered.sourceRuns() > blocks / 4, scattered.toJson());
  }

  @Test
  void roundsRotatingOverDestinationSlotsFillEverySlotAndVerify() throws Exception {
    HostTransferBench.Config c = new HostTransferBench.Config(4096, 64, 3, "cma",
        Layout.SCATTERED).withDestinationSlots(3);
    // The peer's check covers all three slots: each must hold the blocks, the rest zero.
    assertTrue(HostTransferBench.run(c).verified());
    IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
        () -> c.withDestinationSlots(4));
    assertTrue(e.getMessage().contains("every slot written in the timed rounds"), e.getMessage());
  }

  private interface Probe {
    Object get() throws Exception;
  }

  private static boolean available(Probe probe) {
    try {
      probe.get();
      return true;
    } catch (Exception e) {
      return false;
    }
  }

  /** kvferry's own peers, as {@code kvferry bench} uses them without {@code --peers}. */
  private static Path sharedPeers() throws java.io.IOException {
    return PeerTools.locatePeers(null, Files.createTempDirectory("bench-peers-"));
  }
}
