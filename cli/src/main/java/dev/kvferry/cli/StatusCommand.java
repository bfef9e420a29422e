package dev.kvferry.cli;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.IOException;
import java.io.PrintWriter;
import java.net.ConnectException;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.channels.UnresolvedAddressException;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.Callable;
import picocli.CommandLine.Command;
import picocli.CommandLine.Model.CommandSpec;
import picocli.CommandLine.Option;
import picocli.CommandLine.Spec;

/**
 * {@code kvferry status}: what one node's management server knows, as tables: the cluster's
 * members, every engine worker in the cluster, and the node's transfers in flight.
 */
@Command(
    name = "status",
    mixinStandardHelpOptions = true,
    description = {
      "Shows cluster members, engines and transfers in flight, read from a node's management HTTP."
    })
public final class StatusCommand implements Callable<Integer> {

  private static final ObjectMapper JSON = new ObjectMapper();

  @Spec CommandSpec spec;

  @Option(
      names = "--management",
      paramLabel = "HOST:PORT",
      defaultValue = "127.0.0.1:8558",
      description = "Management HTTP address of any node or router (default: ${DEFAULT-VALUE}).")
  String management;

  @Option(
      names = "--timeout-seconds",
      defaultValue = "5",
      description = "How long to wait for each answer (default: ${DEFAULT-VALUE}).")
  int timeoutSeconds;

  /** A failed request, already worded for the user. */
  private static final class StatusException extends Exception {
    private static final long serialVersionUID = 1L;

    StatusException(String message) {
      super(message);
    }
  }

  @Override
  public Integer call() {
    PrintWriter out = spec.commandLine().getOut();
    PrintWriter err = spec.commandLine().getErr();
    HttpClient client =
        HttpClient.newBuilder().connectTimeout(Duration.ofSeconds(timeoutSeconds)).build();
    try {
      JsonNode members = fetch(client, "/cluster/members");
      JsonNode engines = fetch(client, "/kvferry/engines");
      JsonNode transfers = fetch(client, "/kvferry/transfers");
      printMembers(out, members);
      out.println();
      printEngines(out, engines);
      out.println();
      printTransfers(out, transfers);
      out.flush();
      return 0;
    } catch (StatusException e) {
      err.println(e.getMessage());
      err.flush();
      return 1;
    }
  }

  private JsonNode fetch(HttpClient client, String path) throws StatusException {
    URI uri = URI.create("http://" + management + path);
    HttpRequest request =
        HttpRequest.newBuilder(uri).timeout(Duration.ofSeconds(timeoutSeconds)).GET().build();
    HttpResponse<String> response;
    try {
      response = client.send(request, HttpResponse.BodyHandlers.ofString());
    } catch (IOException e) {
      throw new StatusException(
          "cannot reach management at " + management + ": " + reason(e)
              + "; is the node running with --management-port?");
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw new StatusException("interrupted while asking " + uri);
    }
    if (response.statusCode() != 200) {
      throw new StatusException(
          "management at " + management + " answered " + response.statusCode() + " to GET "
              + path + ": " + response.body().strip());
    }
    try {
      return JSON.readTree(response.body());
    } catch (IOException e) {
      throw new StatusException(
          "management at " + management + " sent malformed JSON for " + path + ": "
              + e.getMessage());
    }
  }

  /**
   * The innermost message, or a plain word for the JDK's messageless network exceptions (HttpClient
   * reports a refused connection as a ConnectException with no message).
   */
  private static String reason(Throwable e) {
    String message = null;
    for (Throwable t = e; t != null; t = t.getCause()) {
      if (t instanceof UnresolvedAddressException) {
        return "unknown host";
      }
      if (t.getMessage() != null && !t.getMessage().isBlank()) {
        message = t.getMessage();
      }
    }
    if (message != null) {
      return message;
    }
    return e instanceof ConnectException ? "connection refused" : e.getClass().getSimpleName();
  }

  private void printMembers(PrintWriter out, JsonNode body) {
    JsonNode members = body.path("members");
    out.println(
        "Cluster members (" + members.size() + ", leader " + text(body.path("leader")) + ")");
    Table table = new Table("ADDRESS", "STATUS", "ROLES");
    for (JsonNode m : members) {
      List<String> roles = new ArrayList<>();
      m.path("roles").forEach(r -> roles.add(r.asText()));
      table.row(text(m.path("node")), text(m.path("status")), String.join(",", roles));
    }
    table.print(out);
    JsonNode unreachable = body.path("unreachable");
    for (JsonNode u : unreachable) {
      List<String> observers = new ArrayList<>();
      u.path("observedBy").forEach(o -> observers.add(o.asText()));
      out.println(
          "  UNREACHABLE " + text(u.path("node"))
              + " (seen by " + String.join(", ", observers) + ")");
    }
  }

  private void printEngines(PrintWriter out, JsonNode engines) {
    out.println("Engines (" + engines.size() + ")");
    Table table = new Table("ROLE", "ENGINE ID", "DP", "TP", "MODE", "ADDRESS");
    for (JsonNode e : engines) {
      table.row(
          text(e.path("role")),
          text(e.path("engineId")),
          text(e.path("dpRank")),
          text(e.path("tpRank")),
          text(e.path("mode")),
          text(e.path("address")));
    }
    table.print(out);
  }

  private void printTransfers(PrintWriter out, JsonNode report) {
    JsonNode counts = report.path("counts");
    int total = 0;
    List<String> byState = new ArrayList<>();
    for (Map.Entry<String, JsonNode> e : counts.properties()) {
      total += e.getValue().asInt();
      byState.add(e.getKey() + " " + e.getValue().asInt());
    }
    out.println(
        "Transfers in flight on " + management + ": " + total
            + (byState.isEmpty() ? "" : " (" + String.join(", ", byState) + ")"));
    if (total > 0) {
      Table table = new Table("STATE", "REQUEST", "TRANSFER", "PEER ENGINE", "AGE MS", "WORKER");
      for (JsonNode t : report.path("transfers")) {
        table.row(
            text(t.path("state")),
            text(t.path("requestId")),
            text(t.path("transferId")),
            text(t.path("peerEngineId")),
            text(t.path("ageMs")),
            text(t.path("engine")));
      }
      table.print(out);
    }
    for (JsonNode u : report.path("unanswered")) {
      out.println("  no answer from worker " + u.asText());
    }
  }

  private static String text(JsonNode n) {
    return n.isMissingNode() || n.isNull() ? "-" : n.asText();
  }

  /** Left-aligned columns, two spaces apart, indented by two. */
  private static final class Table {
    private final List<String[]> rows = new ArrayList<>();

    Table(String... header) {
      rows.add(header);
    }

    void row(String... cells) {
      rows.add(cells);
    }

    void print(PrintWriter out) {
      if (rows.size() == 1) {
        out.println("  (none)");
        return;
      }
      int[] widths = new int[rows.get(0).length];
      for (String[] r : rows) {
        for (int i = 0; i < r.length; i++) {
          widths[i] = Math.max(widths[i], r[i].length());
        }
      }
      for (String[] r : rows) {
        StringBuilder line = new StringBuilder("  ");
        for (int i = 0; i < r.length; i++) {
          line.append(r[i]);
          if (i < r.length - 1) {
            line.append(" ".repeat(widths[i] - r[i].length() + 2));
          }
        }
        out.println(line);
      }
    }
  }
}
