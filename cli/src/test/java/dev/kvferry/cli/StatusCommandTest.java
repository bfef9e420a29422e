package dev.kvferry.cli;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvferry.management.ManagementNode;
import dev.kvferry.management.ManagementNodeExtension;
import java.io.IOException;
import java.io.PrintWriter;
import java.io.StringWriter;
import java.net.ServerSocket;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.extension.ExtendWith;
import picocli.CommandLine;

/** {@code kvferry status} against a real node's management server, and against nothing. */
@ExtendWith(ManagementNodeExtension.class)
class StatusCommandTest {

  private record Run(int exitCode, String out, String err) {}

  private static Run status(String... args) {
    StringWriter out = new StringWriter();
    StringWriter err = new StringWriter();
    CommandLine cli = new CommandLine(new StatusCommand());
    cli.setOut(new PrintWriter(out, true));
    cli.setErr(new PrintWriter(err, true));
    int code = cli.execute(args);
    return new Run(code, out.toString(), err.toString());
  }

  @Test
  void printsMembersEnginesAndTransfersInFlight(ManagementNode node) {
    Run run = status("--management", node.hostPort());
    assertEquals(0, run.exitCode(), run.err());
    String out = run.out();
    assertTrue(out.contains("Cluster members (1"), out);
    assertTrue(out.contains(node.clusterAddress()), out);
    assertTrue(out.contains("Up"), out);
    assertTrue(out.contains("Engines (2)"), out);
    assertTrue(out.matches("(?s).*decode\\s+decode-a\\s+0\\s+0\\s+write.*"), out);
    assertTrue(out.matches("(?s).*prefill\\s+prefill-b\\s+1\\s+0\\s+read.*"), out);
    assertTrue(
        out.contains("Transfers in flight on " + node.hostPort() + ": 1 (receiving 1)"), out);
    assertTrue(
        out.matches(
            "(?s).*receiving\\s+req-1\\s+xfer-1\\s+prefill-absent\\s+\\d+\\s+decode-a/tp0.*"),
        out);
  }

  @Test
  void failsWithAClearMessageWhenNothingListens() throws IOException {
    int port;
    try (ServerSocket s = new ServerSocket(0)) {
      port = s.getLocalPort(); // closed again: nothing listens there now
    }
    Run run = status("--management", "127.0.0.1:" + port);
    assertEquals(1, run.exitCode());
    assertEquals(
        "cannot reach management at 127.0.0.1:" + port
            + ": connection refused; is the node running with --management-port?",
        run.err().strip().toLowerCase(java.util.Locale.ROOT));
    assertEquals("", run.out());
  }
}
