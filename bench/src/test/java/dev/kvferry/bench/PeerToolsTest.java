package dev.kvferry.bench;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.file.Path;
import java.util.List;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

class PeerToolsTest {

  @Test
  void missingToolNamesTheDebianPackage(@TempDir Path emptyDir) {
    PeerTools.MissingPeerException e = assertThrows(PeerTools.MissingPeerException.class,
        () -> PeerTools.requireCommand("iperf3", "iperf3", emptyDir.toString()));
    assertEquals("iperf3 not found on PATH: apt-get install -y iperf3", e.getMessage());
  }

  @Test
  void missingPeerFileSaysWhereItLookedAndHowToPointElsewhere(@TempDir Path dir) {
    PeerTools tools = new PeerTools(dir, dir);
    PeerTools.MissingPeerException e = assertThrows(PeerTools.MissingPeerException.class,
        () -> tools.peerFile("memcpy_ceiling.c"));
    assertTrue(e.getMessage().contains(dir.toString()) && e.getMessage().contains("--peers"),
        e.getMessage());
  }

  @Test
  void runReturnsTheLastLineAStepPrinted() throws Exception {
    PeerTools.Output o = PeerTools.run(List.of("sh", "-c", "echo log; echo '{\"a\": 1}'"), null,
        java.time.Duration.ofSeconds(30));
    assertEquals(0, o.exitCode());
    assertEquals("{\"a\": 1}", o.lastLine());
  }
}
