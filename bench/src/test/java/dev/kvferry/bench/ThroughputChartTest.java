package dev.kvferry.bench;

import static org.junit.jupiter.api.Assertions.assertEquals;

import java.awt.image.BufferedImage;
import java.nio.file.Path;
import java.util.LinkedHashMap;
import java.util.Map;
import javax.imageio.ImageIO;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

class ThroughputChartTest {

  @Test
  void writesAReadablePngEvenWithGapsInASeries(@TempDir Path dir) throws Exception {
    Map<String, Double[]> series = new LinkedHashMap<>();
    series.put("kvferry cma contiguous", new Double[] {3.0, 4.5, 5.0});
    series.put("memcpy contiguous (peer)", new Double[] {3.5, null, 6.0});
    Path png = dir.resolve("sub/chart.png");
    ThroughputChart.write(png, "test", new int[] {512, 2048, 8192}, series);
    BufferedImage image = ImageIO.read(png.toFile());
    assertEquals(960, image.getWidth());
    assertEquals(600, image.getHeight());
  }
}
