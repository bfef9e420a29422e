package dev.kvferry.bench;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assumptions.assumeTrue;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.List;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/** kvferry's own peer programs: unpacked from the jar, and each runs and answers as the suites read it. */
class BundledPeersTest {

  private static final ObjectMapper JSON = new ObjectMapper();

  @Test
  void withoutPeersFolderKvferryUnpacksItsOwnPeers(@TempDir Path work) throws Exception {
    Path dir = PeerTools.locatePeers(null, work);
    for (String name : PeerTools.BUNDLED_PEERS) {
      assertTrue(Files.size(dir.resolve(name)) > 0, name);
    }
    assertEquals(work.resolve("elsewhere"), PeerTools.locatePeers(work.resolve("elsewhere"), work));
  }

  @Test
  void memcpyPeerDrawsDistinctBlocksFromALargerPool(@TempDir Path work) throws Exception {
    PeerTools peers = new PeerTools(PeerTools.locatePeers(null, work), work);
    Path binary = peers.memcpyCeiling();
    JsonNode out = JSON.readTree(PeerTools.run(
        List.of(binary.toString(), "4096", "64", "3", "128"), null, Duration.ofSeconds(60)).lastLine());
    assertEquals(64, out.get("num_blocks").asInt());
    assertEquals(128, out.get("pool_blocks").asInt());
    assertTrue(out.get("scattered_gbps").asDouble() > 0 && out.get("contiguous_gbps").asDouble() > 0);
    PeerTools.Output refused = PeerTools.run(
        List.of(binary.toString(), "4096", "64", "3", "32"), null, Duration.ofSeconds(60));
    assertEquals(2, refused.exitCode(), "a pool smaller than the transfer is refused");
  }

  @Test
  void plannerPeerFusesBlocksAdjacentOnBothSidesAsTheSeedDoes(@TempDir Path work) throws Exception {
    PeerTools peers = new PeerTools(PeerTools.locatePeers(null, work), work);
    String python = peers.pythonWithNumpy();
    // Blocks 3,4 -> 7,8 are adjacent on both sides (one copy); 9 -> 2 is alone. Standard layout:
    // K and V regions, block of 16 tokens x 2 heads x 4 dims x 2 bytes = 256 bytes.
    String input = "{\"layout\": \"standard\", \"num_blocks\": 10, \"remote_num_blocks\": 12,"
        + " \"block_size\": 16, \"kv_heads\": 2, \"head_dim\": 4, \"elem_size\": 2,"
        + " \"local_block_ids\": [3, 4, 9], \"remote_block_ids\": [7, 8, 2]}";
    JsonNode out = JSON.readTree(PeerTools.run(
        List.of(python, peers.peerFile("seed_planner.py").toString()),
        input.getBytes(java.nio.charset.StandardCharsets.UTF_8),
        Duration.ofSeconds(60)).lastLine());
    // K: [768 +512 -> 1792], [2304 -> 512]; V (local +2560, remote +3072): the same, shifted.
    assertEquals("[768,2304,3328,4864]", out.get("local_offsets").toString());
    assertEquals("[1792,512,4864,3584]", out.get("remote_offsets").toString());
    assertEquals("[512,256,512,256]", out.get("sizes").toString());
  }

  @Test
  void notifyPeerTimesRoundTripsOnTheSeedsStack(@TempDir Path work) throws Exception {
    PeerTools peers = new PeerTools(PeerTools.locatePeers(null, work), work);
    String python;
    try {
      python = peers.pythonWithZmq();
    } catch (PeerTools.MissingPeerException e) {
      assumeTrue(false, e.getMessage());
      return;
    }
    JsonNode out = JSON.readTree(PeerTools.run(
        List.of(python, peers.peerFile("seed_notify_rtt.py").toString(), "200", "8"), null,
        Duration.ofSeconds(60)).lastLine());
    assertEquals(200, out.get("round_trips").asInt());
    assertTrue(out.get("p50_us").asDouble() > 0 && out.get("p99_us").asDouble() >= out.get("p50_us").asDouble());
  }
}
