package dev.kvferry.cli;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.PrintWriter;
import java.io.StringWriter;
import org.junit.jupiter.api.Test;
import picocli.CommandLine;

class BenchCommandTest {

  @Test
  void unknownSuiteIsRefusedWithTheValidNames() {
    CommandLine cli = KvferryCli.newCommandLine();
    StringWriter err = new StringWriter();
    cli.setErr(new PrintWriter(err));
    int code = cli.execute("bench", "--only", "planner,gpu");
    assertEquals(2, code);
    assertTrue(err.toString().contains("unknown suite 'gpu'")
        && err.toString().contains(String.join(", ", dev.kvferry.bench.BenchRunner.SUITES)), err.toString());
  }

  @Test
  void benchIsRegisteredWithItsHelp() {
    CommandLine cli = KvferryCli.newCommandLine();
    StringWriter out = new StringWriter();
    cli.setOut(new PrintWriter(out));
    assertEquals(0, cli.execute("bench", "--help"));
    assertTrue(out.toString().contains("--json") && out.toString().contains("--only"),
        out.toString());
  }
}
