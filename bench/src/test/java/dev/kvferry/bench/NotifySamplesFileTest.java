package dev.kvferry.bench;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.file.Files;
import java.nio.file.Path;
import java.util.List;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/** {@code -Dkvferry.notify.samples-file}: every measured round trip, in the order it was sent. */
class NotifySamplesFileTest {

  @Test
  void eachMeasuredRoundTripIsWrittenWithWhenItWasSent(@TempDir Path dir) throws Exception {
    Path file = dir.resolve("samples.csv");
    System.setProperty("kvferry.notify.samples-file", file.toString());
    NotifyRoundTripSuite.Latency latency;
    try {
      latency = NotifyRoundTripSuite.kvferry(40, 5, 0L);
    } finally {
      System.clearProperty("kvferry.notify.samples-file");
    }
    List<String> lines = Files.readAllLines(file);
    assertEquals("sent at ns,round trip us", lines.get(0));
    assertEquals(41, lines.size(), "a header and one line per measured round trip");
    long previousSent = Long.MIN_VALUE;
    double max = 0;
    for (String line : lines.subList(1, lines.size())) {
      String[] f = line.split(",");
      long sent = Long.parseLong(f[0]);
      double us = Double.parseDouble(f[1]);
      assertTrue(sent > previousSent, "sent times increase: " + line);
      assertTrue(us > 0, line);
      previousSent = sent;
      max = Math.max(max, us);
    }
    // The file holds the samples the suite's percentiles were taken from.
    assertTrue(latency.p99Us() <= max, latency + " against the file's largest " + max);
  }
}
