package dev.kvferry.cli;

import static java.nio.charset.StandardCharsets.UTF_8;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.ByteArrayInputStream;
import java.io.PrintWriter;
import java.io.StringWriter;
import org.junit.jupiter.api.Test;
import picocli.CommandLine;

class PlanCommandTest {

  record Result(int exitCode, String out, String err) {}

  static Result runPlan(String stdin, String... args) {
    StringWriter out = new StringWriter();
    StringWriter err = new StringWriter();
    CommandLine cli =
        new CommandLine(new PlanCommand(() -> new ByteArrayInputStream(stdin.getBytes(UTF_8))));
    cli.setOut(new PrintWriter(out));
    cli.setErr(new PrintWriter(err));
    int exitCode = cli.execute(args);
    return new Result(exitCode, out.toString(), err.toString());
  }

  private static final String STANDARD =
      "{\"layout\": \"standard\", \"num_blocks\": 10, \"remote_num_blocks\": 20,"
          + " \"block_size\": 16, \"kv_heads\": 8, \"head_dim\": 128, \"elem_size\": 2,"
          + " \"local_block_ids\": %s, \"remote_block_ids\": %s}";

  private static void assertInvalid(Result result, String stderrLine) {
    assertEquals(2, result.exitCode(), result.err());
    assertEquals("", result.out());
    assertEquals("kvferry plan: " + stderrLine + System.lineSeparator(), result.err());
  }

  @Test
  void isRegisteredOnTheKvferryCommand() {
    assertTrue(KvferryCli.newCommandLine().getSubcommands().containsKey("plan"));
  }

  @Test
  void printsMergedOffsetsAsOneJsonLineWithTheSeedsSeparators() {
    Result result = runPlan(String.format(STANDARD, "[2, 3, 4]", "[7, 8, 9]"));

    assertEquals(0, result.exitCode(), result.err());
    assertEquals(
        "{\"local_offsets\": [65536, 393216], \"remote_offsets\": [229376, 884736],"
            + " \"sizes\": [98304, 98304]}"
            + System.lineSeparator(),
        result.out());
  }

  @Test
  void defaultsRemoteNumBlocksToNumBlocksAndIgnoresFieldsTheLayoutDoesNotUse() {
    Result result =
        runPlan(
            "{\"layout\": \"mla\", \"num_blocks\": 4, \"block_size\": 1, \"kv_heads\": 8,"
                + " \"head_dim\": 128, \"latent\": 2, \"elem_size\": 1,"
                + " \"local_block_ids\": [1, 0, 3], \"remote_block_ids\": [3, 2, 0]}");

    assertEquals(0, result.exitCode(), result.err());
    assertEquals(
        "{\"local_offsets\": [0, 6], \"remote_offsets\": [4, 0], \"sizes\": [4, 2]}"
            + System.lineSeparator(),
        result.out());
  }

  @Test
  void plansWholeBlocksOfABlocksFirstCacheAsOneCopyPerRun() {
    // [10, 2, 16, 8, 128] bf16: a block is 64 KiB of K then V; blocks 2..4 to 7..9 are one copy.
    Result result = runPlan(String.format(STANDARD, "[2, 3, 4]", "[7, 8, 9]")
        .replace("\"standard\"", "\"blocks_first\""));

    assertEquals(0, result.exitCode(), result.err());
    assertEquals(
        "{\"local_offsets\": [131072], \"remote_offsets\": [458752], \"sizes\": [196608]}"
            + System.lineSeparator(),
        result.out());
  }

  @Test
  void printsEmptyListsForARequestWithoutBlocks() {
    Result result = runPlan(String.format(STANDARD, "[]", "[]"));

    assertEquals(
        "{\"local_offsets\": [], \"remote_offsets\": [], \"sizes\": []}" + System.lineSeparator(),
        result.out());
  }

  @Test
  void benchAddsSecondsPerCall() {
    Result result =
        runPlan(String.format(STANDARD, "[5, 1]", "[0, 1]"), "--bench", "3", "--warmup-ms", "0");

    assertEquals(0, result.exitCode(), result.err());
    assertTrue(
        result.out().matches("\\{\"local_offsets\": .*, \"seconds_per_call\": [0-9.E-]+}\\R"),
        result.out());
  }

  @Test
  void rejectsABenchOfZeroCalls() {
    assertInvalid(
        runPlan(String.format(STANDARD, "[1]", "[1]"), "--bench", "0"),
        "--bench must be at least 1, got 0");
  }

  @Test
  void rejectsAnOutOfRangeRemoteIdNamingItAndItsPosition() {
    assertInvalid(
        runPlan(String.format(STANDARD, "[1, 2]", "[3, 20]")),
        "remote block id 20 at position 1 is out of range: the remote engine has 20 blocks"
            + " (ids 0 to 19)");
  }

  @Test
  void rejectsARepeatedLocalId() {
    assertInvalid(
        runPlan(String.format(STANDARD, "[4, 4]", "[0, 1]")),
        "local block id 4 at position 1 repeats position 0; each block may appear once per"
            + " request");
  }

  @Test
  void rejectsListsOfDifferentLengths() {
    assertInvalid(
        runPlan(String.format(STANDARD, "[4, 5]", "[0]")),
        "local block id 5 at position 1 has no remote block: 2 local block ids but 1 remote"
            + " block ids; each local block needs exactly one remote block");
  }

  @Test
  void rejectsAMissingField() {
    assertInvalid(
        runPlan("{\"layout\": \"standard\", \"num_blocks\": 4}"), "missing field block_size");
  }

  @Test
  void rejectsAnUnknownLayout() {
    assertInvalid(
        runPlan(String.format(STANDARD, "[1]", "[1]").replace("\"standard\"", "\"paged\"")),
        "layout must be \"standard\", \"blocks_first\" or \"mla\", got \"paged\"");
  }

  @Test
  void rejectsAMisspeltField() {
    assertInvalid(
        runPlan(
            String.format(STANDARD, "[1]", "[1]").replace("remote_num_blocks", "remote_blocks")),
        "unknown field \"remote_blocks\"; known fields: block_size, elem_size, head_dim, kv_heads,"
            + " latent, layout, local_block_ids, num_blocks, remote_block_ids, remote_num_blocks");
  }

  @Test
  void rejectsANonIntegerBlockIdNamingItsIndex() {
    assertInvalid(
        runPlan(String.format(STANDARD, "[1, 2.5]", "[1, 2]")),
        "local_block_ids[1] must be an integer block id, got 2.5");
  }

  @Test
  void rejectsABlockIdBeyondAnInt() {
    assertInvalid(
        runPlan(String.format(STANDARD, "[1]", "[99999999999]")),
        "remote_block_ids[0] must be an integer block id, got 99999999999");
  }

  @Test
  void rejectsAZeroDimension() {
    assertInvalid(
        runPlan(
            String.format(STANDARD, "[1]", "[1]").replace("\"kv_heads\": 8", "\"kv_heads\": 0")),
        "kv_heads must be an integer from 1 to 2147483647, got 0");
  }

  @Test
  void rejectsInputThatIsNotJson() {
    Result result = runPlan("{\"layout\": ");

    assertEquals(2, result.exitCode());
    assertTrue(result.err().startsWith("kvferry plan: input is not valid JSON: "), result.err());
    assertEquals(1, result.err().lines().count(), result.err());
  }

  @Test
  void rejectsEmptyInput() {
    assertInvalid(runPlan(""), "expected one JSON object on stdin, got nothing");
  }

  @Test
  void rejectsTwoObjects() {
    Result result = runPlan(String.format(STANDARD, "[1]", "[1]") + " {}");

    assertEquals(2, result.exitCode());
    assertTrue(result.err().startsWith("kvferry plan: input is not valid JSON: "), result.err());
  }
}
