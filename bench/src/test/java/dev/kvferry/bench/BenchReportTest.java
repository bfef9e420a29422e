package dev.kvferry.bench;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.util.List;
import org.junit.jupiter.api.Test;

class BenchReportTest {

  @Test
  void throughputRatioIsKvferryOverPeerAndTimeRatioIsPeerOverKvferry() {
    BenchRow throughput = BenchRow.higherIsBetter("t", "GB/s", 4.5, 5.0, 0.9, "");
    BenchRow time = BenchRow.lowerIsBetter("p", "us", 10.0, 300.0, 20.0, "");
    assertEquals(0.9, throughput.ratio(), 1e-9);
    assertTrue(throughput.meetsGoal());
    assertEquals(30.0, time.ratio(), 1e-9);
    assertTrue(time.meetsGoal());
  }

  @Test
  void rowWithoutPeerHasNoRatioAndIsNotJudged() {
    BenchRow r = BenchRow.higherIsBetter("tcp", "GB/s", 3.0, null, 0.9,
        "iperf3 not found on PATH: apt-get install -y iperf3");
    assertNull(r.ratio());
    assertNull(r.meetsGoal());
  }

  @Test
  void jsonIsOneLineWithEveryFieldAndNullsWhereNothingWasMeasured() throws Exception {
    BenchReport report = new BenchReport(List.of(
        BenchRow.higherIsBetter("cma \"x\"", "GB/s", 4.5, 5.0, 0.9, ""),
        BenchRow.figure("heap", "KiB", 12.5, "line one\nline two")));
    String json = report.toJson();
    assertTrue(!json.contains("\n"), json);
    JsonNode rows = new ObjectMapper().readTree(json).get("rows");
    assertEquals(2, rows.size());
    JsonNode first = rows.get(0);
    assertEquals("cma \"x\"", first.get("name").asText());
    assertEquals("GB/s", first.get("unit").asText());
    assertEquals(4.5, first.get("kvferry").asDouble(), 1e-9);
    assertEquals(5.0, first.get("peer").asDouble(), 1e-9);
    assertEquals(0.9, first.get("ratio").asDouble(), 1e-9);
    assertEquals(0.9, first.get("goal").asDouble(), 1e-9);
    assertTrue(rows.get(1).get("peer").isNull());
    assertTrue(rows.get(1).get("ratio").isNull());
    assertTrue(rows.get(1).get("goal").isNull());
  }

  @Test
  void tableMarksMissedGoalsAndListsNotes() {
    String table = new BenchReport(List.of(
        BenchRow.lowerIsBetter("notify round trip p50", "us", 400.0, 150.0, 1 / 1.5,
            "decode JVM CPU 300 us per round trip"))).toTable();
    assertTrue(table.contains("MISSED"), table);
    assertTrue(table.contains("0.38x"), table);
    assertTrue(table.contains("notes:") && table.contains("decode JVM CPU"), table);
  }
}
