package dev.kvferry.it;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvferry.demo.Demo;
import dev.kvferry.demo.DemoOptions;
import dev.kvferry.demo.ModeReport;
import java.util.List;
import org.junit.jupiter.api.Test;

/**
 * The demo's own code path in a small geometry: a router, a prefill node and a decode node as
 * separate JVMs in a real cluster on loopback, both modes, every byte verified on D, no block
 * leaked on either side.
 */
class DemoEndToEndTest {

  private static DemoOptions small(String transport, boolean mla, double abortRate) {
    return new DemoOptions(transport, List.of("write", "read"), 3, 2, 16, 4, 2, mla, 24,
        96, 72, 24, 1, 150, abortRate, 0.3, 6, 11, false);
  }

  private static List<ModeReport> run(DemoOptions options) throws Exception {
    try (Demo demo = new Demo(options)) {
      List<ModeReport> reports = demo.run();
      Demo.printTable(reports, System.out);
      return reports;
    }
  }

  private static void assertClean(ModeReport r, boolean expectAborts) {
    assertEquals(0, r.mismatches(), r.mode() + ": " + r.problems());
    assertEquals(0, r.leakedBlocks(), r.mode() + ": " + r.problems());
    assertEquals(0, r.failed(), r.mode() + ": " + r.problems());
    assertEquals(r.requests(), r.completed() + r.aborted(), r.mode() + ": every request ended");
    assertTrue(r.bytes() > 0, r.mode() + " moved no bytes");
    if (expectAborts) {
      assertTrue(r.aborted() > 0, r.mode() + ": the workload was meant to abort some requests");
    }
  }

  @Test
  void cmaMovesAndVerifiesEveryByteInBothModesWithAbortsAndUnequalNumBlocks() throws Exception {
    for (ModeReport r : run(small("cma", false, 0.3))) {
      assertClean(r, true);
    }
  }

  @Test
  void cmaMovesEveryByteFromTwoPrefillRanksOf16TokenBlocksToOneDecodeRankOf32() throws Exception {
    DemoOptions options =
        new DemoOptions("cma", List.of("write", "read"), 3, 2, 16, 16, 2, false, 24, 96, 72, 24, 1,
                150, 0.2, 0.3, 6, 13, false)
            .withShapes(2, 1, 16, 32);
    for (ModeReport r : run(options)) {
      assertClean(r, false);
    }
  }

  @Test
  void tcpMovesAndVerifiesEveryByteOfAnMlaCacheInBothModes() throws Exception {
    for (ModeReport r : run(small("tcp", true, 0.0))) {
      assertClean(r, false);
    }
  }
}
