package dev.kvferry.bench;

import java.util.ArrayList;
import java.util.List;
import java.util.Locale;

/** The rows of one {@code kvferry bench} run, as a text table and as one line of JSON. */
public final class BenchReport {

  private final List<BenchRow> rows;

  public BenchReport(List<BenchRow> rows) {
    this.rows = List.copyOf(rows);
  }

  public List<BenchRow> rows() {
    return rows;
  }

  /** Whether some row's work was wrong (see {@link BenchRow#failed()}). */
  public boolean anyFailed() {
    return rows.stream().anyMatch(BenchRow::failed);
  }

  /** A fixed-width table, then the notes of the rows that have one. */
  public String toTable() {
    int nameWidth = "name".length();
    for (BenchRow r : rows) {
      nameWidth = Math.max(nameWidth, r.name().length());
    }
    String format = "%-" + nameWidth + "s  %-9s %12s %12s %8s %7s  %s%n";
    StringBuilder out = new StringBuilder();
    out.append(String.format(Locale.ROOT, format, "name", "unit", "kvferry", "peer", "ratio",
        "goal", ""));
    List<String> notes = new ArrayList<>();
    for (BenchRow r : rows) {
      Boolean met = r.meetsGoal();
      String verdict = r.failed() ? "FAILED" : met == null ? "" : met ? "met" : "MISSED";
      out.append(String.format(Locale.ROOT, format, r.name(), r.unit(), figure(r.kvferry()),
          figure(r.peer()), ratio(r.ratio()), r.goal() == null ? "-" : ">=" + ratio(r.goal()),
          verdict));
      if (!r.note().isEmpty()) {
        notes.add(r.name() + ": " + r.note());
      }
    }
    if (!notes.isEmpty()) {
      out.append(System.lineSeparator()).append("notes:").append(System.lineSeparator());
      for (String n : notes) {
        out.append("  ").append(n).append(System.lineSeparator());
      }
    }
    return out.toString();
  }

  /** {@code {"rows": [{"name", "unit", "kvferry", "peer", "ratio", "goal", "failed", "note"}, ...]}} on one line. */
  public String toJson() {
    StringBuilder json = new StringBuilder("{\"rows\": [");
    for (int i = 0; i < rows.size(); i++) {
      BenchRow r = rows.get(i);
      if (i > 0) {
        json.append(", ");
      }
      json.append("{\"name\": ").append(quote(r.name()))
          .append(", \"unit\": ").append(quote(r.unit()))
          .append(", \"kvferry\": ").append(number(r.kvferry()))
          .append(", \"peer\": ").append(number(r.peer()))
          .append(", \"ratio\": ").append(number(r.ratio()))
          .append(", \"goal\": ").append(number(r.goal()))
          .append(", \"failed\": ").append(r.failed())
          .append(", \"note\": ").append(quote(r.note()))
          .append('}');
    }
    return json.append("]}").toString();
  }

  private static String figure(Double v) {
    if (v == null) {
      return "-";
    }
    double a = Math.abs(v);
    return String.format(Locale.ROOT, a >= 100 ? "%.1f" : a >= 1 ? "%.3f" : "%.4f", v);
  }

  private static String ratio(Double v) {
    return v == null ? "-" : String.format(Locale.ROOT, v >= 100 ? "%.0fx" : "%.2fx", v);
  }

  private static String number(Double v) {
    if (v == null || v.isNaN() || v.isInfinite()) {
      return "null";
    }
    return String.format(Locale.ROOT, "%.6g", v);
  }

  static String quote(String s) {
    StringBuilder q = new StringBuilder(s.length() + 2).append('"');
    for (int i = 0; i < s.length(); i++) {
      char c = s.charAt(i);
      switch (c) {
        case '"' -> q.append("\\\"");
        case '\\' -> q.append("\\\\");
        case '\n' -> q.append("\\n");
        case '\r' -> q.append("\\r");
        case '\t' -> q.append("\\t");
        default -> {
          if (c < 0x20) {
            q.append(String.format(Locale.ROOT, "\\u%04x", (int) c));
          } else {
            q.append(c);
          }
        }
      }
    }
    return q.append('"').toString();
  }
}
