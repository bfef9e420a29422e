package dev.kvferry.bench;

import java.awt.BasicStroke;
import java.awt.Color;
import java.awt.Font;
import java.awt.FontMetrics;
import java.awt.Graphics2D;
import java.awt.RenderingHints;
import java.awt.image.BufferedImage;
import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Locale;
import java.util.Map;
import javax.imageio.ImageIO;

/**
 * Draws throughput against prompt length as a PNG with Java2D (no plotting library needed): one
 * line per series, prompt lengths on a log-2 axis. Series whose label ends in "(peer)" are dashed.
 */
public final class ThroughputChart {

  private static final Color[] COLORS = {
    new Color(0x1f77b4), new Color(0xff7f0e), new Color(0x2ca02c), new Color(0xd62728),
    new Color(0x9467bd), new Color(0x8c564b), new Color(0xe377c2), new Color(0x7f7f7f)
  };

  private ThroughputChart() {}

  /**
   * @param series label to GB/s at each of {@code promptTokens} (null where not measured)
   */
  public static void write(Path png, String title, int[] promptTokens, Map<String, Double[]> series)
      throws IOException {
    System.setProperty("java.awt.headless", "true");
    int width = 960;
    int height = 600;
    int left = 80;
    int right = 300;
    int top = 60;
    int bottom = 70;
    BufferedImage image = new BufferedImage(width, height, BufferedImage.TYPE_INT_RGB);
    Graphics2D g = image.createGraphics();
    try {
      g.setRenderingHint(RenderingHints.KEY_ANTIALIASING, RenderingHints.VALUE_ANTIALIAS_ON);
      g.setRenderingHint(RenderingHints.KEY_TEXT_ANTIALIASING,
          RenderingHints.VALUE_TEXT_ANTIALIAS_ON);
      g.setColor(Color.WHITE);
      g.fillRect(0, 0, width, height);
      g.setFont(new Font(Font.SANS_SERIF, Font.BOLD, 18));
      g.setColor(Color.BLACK);
      g.drawString(title, left, 35);

      double max = 0;
      for (Double[] values : series.values()) {
        for (Double v : values) {
          if (v != null) {
            max = Math.max(max, v);
          }
        }
      }
      double yMax = niceCeiling(max <= 0 ? 1 : max * 1.1);
      int plotW = width - left - right;
      int plotH = height - top - bottom;
      double xMin = log2(promptTokens[0]);
      double xMax = log2(promptTokens[promptTokens.length - 1]);
      double xPad = (xMax - xMin) * 0.06;

      // Grid and axes.
      g.setFont(new Font(Font.SANS_SERIF, Font.PLAIN, 13));
      FontMetrics fm = g.getFontMetrics();
      int ticks = 5;
      for (int i = 0; i <= ticks; i++) {
        double v = yMax * i / ticks;
        int y = top + plotH - (int) Math.round(plotH * v / yMax);
        g.setColor(new Color(0xe6e6e6));
        g.drawLine(left, y, left + plotW, y);
        g.setColor(Color.DARK_GRAY);
        String label = String.format(Locale.ROOT, "%.1f", v);
        g.drawString(label, left - 10 - fm.stringWidth(label), y + 5);
      }
      for (int t : promptTokens) {
        int x = xPixel(log2(t), xMin - xPad, xMax + xPad, left, plotW);
        g.setColor(new Color(0xe6e6e6));
        g.drawLine(x, top, x, top + plotH);
        g.setColor(Color.DARK_GRAY);
        String label = String.format(Locale.ROOT, "%,d", t);
        g.drawString(label, x - fm.stringWidth(label) / 2, top + plotH + 20);
      }
      g.setColor(Color.BLACK);
      g.drawRect(left, top, plotW, plotH);
      String xTitle = "prompt tokens (Llama-3-8B geometry: 32 layers, 32 KiB K or V blocks)";
      g.drawString(xTitle, left + (plotW - fm.stringWidth(xTitle)) / 2, height - 25);
      Graphics2D rotated = (Graphics2D) g.create();
      rotated.rotate(-Math.PI / 2);
      rotated.drawString("GB/s (1e9 bytes per second)", -(top + plotH / 2 + 90), 25);
      rotated.dispose();

      // Series and legend.
      int i = 0;
      int legendY = top + 10;
      for (Map.Entry<String, Double[]> e : series.entrySet()) {
        Color color = COLORS[i++ % COLORS.length];
        boolean peer = e.getKey().endsWith("(peer)");
        g.setColor(color);
        g.setStroke(peer
            ? new BasicStroke(2.2f, BasicStroke.CAP_BUTT, BasicStroke.JOIN_ROUND, 1f,
                new float[] {8f, 6f}, 0f)
            : new BasicStroke(2.6f));
        Double[] values = e.getValue();
        int prevX = -1;
        int prevY = -1;
        for (int k = 0; k < values.length && k < promptTokens.length; k++) {
          if (values[k] == null) {
            prevX = -1;
            continue;
          }
          int x = xPixel(log2(promptTokens[k]), xMin - xPad, xMax + xPad, left, plotW);
          int y = top + plotH - (int) Math.round(plotH * values[k] / yMax);
          if (prevX >= 0) {
            g.drawLine(prevX, prevY, x, y);
          }
          g.fillOval(x - 4, y - 4, 8, 8);
          prevX = x;
          prevY = y;
        }
        g.drawLine(left + plotW + 20, legendY, left + plotW + 50, legendY);
        g.setColor(Color.BLACK);
        g.drawString(e.getKey(), left + plotW + 58, legendY + 5);
        legendY += 24;
      }
    } finally {
      g.dispose();
    }
    Path parent = png.toAbsolutePath().getParent();
    if (parent != null) {
      Files.createDirectories(parent);
    }
    if (!ImageIO.write(image, "png", png.toFile())) {
      throw new IOException("no PNG writer available");
    }
  }

  private static int xPixel(double v, double min, double max, int left, int width) {
    return left + (int) Math.round(width * (v - min) / (max - min));
  }

  private static double log2(double v) {
    return Math.log(v) / Math.log(2);
  }

  private static double niceCeiling(double v) {
    double magnitude = Math.pow(10, Math.floor(Math.log10(v)));
    for (double step : new double[] {1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10}) {
      if (step * magnitude >= v) {
        return step * magnitude;
      }
    }
    return 10 * magnitude;
  }
}
