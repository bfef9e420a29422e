package dev.kvferry.it;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assumptions.assumeTrue;

import dev.kvferry.bench.BenchRow;
import dev.kvferry.bench.EnginePortSuite;
import java.io.ByteArrayOutputStream;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.List;
import org.junit.jupiter.api.Test;

/**
 * {@code kvferry bench --only port} at a tiny size: a real node JVM with {@code --engine port}
 * and the Python client timing it. Every row has a figure; nothing failed. (Its node is a
 * {@code kvferry} child process, which needs the cli module this module has on its class path.)
 */
class EnginePortBenchTest {

  @Test
  void thePortSuiteMeasuresEveryRow() {
    Path python = Path.of("/usr/bin/python3");
    assumeTrue(Files.isExecutable(python), "no /usr/bin/python3");
    ByteArrayOutputStream progress = new ByteArrayOutputStream();
    List<BenchRow> rows = new EnginePortSuite(python,
        new PrintStream(progress, true, StandardCharsets.UTF_8), 10, 100).run();
    assertEquals(List.of("engine port round trip p50 (ping)", "engine port scheduler call p50",
        "engine port time in a step, 256 req, 0 new", "engine port time in a step, 256 req, 16 new",
        "engine port time in a step, 256 req, 256 new",
        "engine port time in a step, 256 req, 256 new, node told"),
        rows.stream().map(BenchRow::name).toList(), rows.toString());
    for (BenchRow r : rows) {
      assertFalse(r.failed(), r.name() + ": " + r.note());
      assertNotNull(r.kvferry(), r.name() + ": " + r.note());
      assertTrue(r.kvferry() > 0, r.name() + ": " + r.kvferry());
    }
  }
}
