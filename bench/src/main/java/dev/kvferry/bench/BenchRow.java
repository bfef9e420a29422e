package dev.kvferry.bench;

/**
 * One line of the {@code kvferry bench} table: kvferry's figure and its peer's from the same run.
 *
 * @param name what was measured, with its size
 * @param unit the unit of {@code kvferry} and {@code peer}
 * @param kvferry kvferry's figure, or null when it could not be measured
 * @param peer the peer's figure in the same run, or null (no peer, or the peer tool is missing)
 * @param ratio oriented so that higher is better for kvferry, or null
 * @param goal the ratio DESIGN section 7 asks for, or null when the row has no goal
 * @param failed whether the row's work was wrong (bytes at D differ, the plans differ, kvferry's
 *     side could not run): such a row is never judged met, whatever its ratio
 * @param note why a figure is missing or the row failed, or what the row measures; may be empty
 */
public record BenchRow(
    String name, String unit, Double kvferry, Double peer, Double ratio, Double goal,
    boolean failed, String note) {

  public BenchRow {
    note = note == null ? "" : note;
  }

  /** A row whose peer is faster when its figure is higher (throughput): ratio = kvferry / peer. */
  public static BenchRow higherIsBetter(
      String name, String unit, Double kvferry, Double peer, Double goal, String note) {
    return new BenchRow(name, unit, kvferry, peer, divide(kvferry, peer), goal, false, note);
  }

  /** A row whose figure is a time (lower is better): ratio = peer / kvferry. */
  public static BenchRow lowerIsBetter(
      String name, String unit, Double kvferry, Double peer, Double goal, String note) {
    return new BenchRow(name, unit, kvferry, peer, divide(peer, kvferry), goal, false, note);
  }

  /** A figure with no peer and no goal. */
  public static BenchRow figure(String name, String unit, Double kvferry, String note) {
    return new BenchRow(name, unit, kvferry, null, null, null, false, note);
  }

  /** This row with {@code newNote} as its note. */
  public BenchRow withNote(String newNote) {
    return new BenchRow(name, unit, kvferry, peer, ratio, goal, failed, newNote);
  }

  /** This row marked failed, {@code why} in front of its note. */
  public BenchRow failedBecause(String why) {
    return new BenchRow(name, unit, kvferry, peer, ratio, goal, true,
        note.isEmpty() ? why : why + "; " + note);
  }

  /**
   * Whether the row has a goal and its ratio reaches it; false for a failed row; null when there
   * is nothing to judge.
   */
  public Boolean meetsGoal() {
    if (failed) {
      return false;
    }
    return goal == null || ratio == null ? null : ratio >= goal;
  }

  private static Double divide(Double a, Double b) {
    return a == null || b == null || b == 0 ? null : a / b;
  }
}
