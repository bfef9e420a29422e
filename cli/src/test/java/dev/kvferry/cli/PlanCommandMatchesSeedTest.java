package dev.kvferry.cli;

import dev.kvferry.actors.plan.BlockIdSamples;
import static java.nio.charset.StandardCharsets.UTF_8;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assumptions.assumeTrue;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Random;
import java.util.StringJoiner;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * Runs {@code kvferry plan} and the seed's planner (the bench's peer {@code seed_planner.py}) on the
 * same random valid requests and expects the same bytes out. Skipped where python3 with numpy or
 * the script is missing; {@code -Dkvferry.seedPlanner=PATH} points at another copy of the script.
 */
class PlanCommandMatchesSeedTest {

  private static final long SEED = 20261130L;
  private static final int REQUESTS = 200;
  private static final int THROUGH_THE_SCRIPT_AS_IS = 3;

  /**
   * Imports the seed script unchanged and runs its main() steps once per input line, so 200
   * requests cost one Python start instead of 200.
   */
  private static final String DRIVER =
      String.join(
          "\n",
          "import importlib.util, json, sys",
          "spec = importlib.util.spec_from_file_location('seed_planner', sys.argv[1])",
          "seed = importlib.util.module_from_spec(spec)",
          "spec.loader.exec_module(seed)",
          "for line in sys.stdin:",
          "    g = json.loads(line)",
          "    lo, ro, sz = seed.compute_block_transfer_offsets(",
          "        g, g['local_block_ids'], g['remote_block_ids'])",
          "    json.dump({'local_offsets': lo, 'remote_offsets': ro, 'sizes': sz}, sys.stdout)",
          "    sys.stdout.write('\\n')",
          "");

  private static Path script;
  private static String skipReason;

  @BeforeAll
  static void findSeedPlanner() {
    // kvferry's own copy of the seed's planner (the bench's peer), or another one named here.
    String override = System.getProperty("kvferry.seedPlanner");
    try {
      script =
          override != null
              ? Path.of(override)
              : dev.kvferry.bench.PeerTools.locatePeers(null, Files.createTempDirectory("seed-"))
                  .resolve("seed_planner.py");
    } catch (java.io.IOException e) {
      throw new java.io.UncheckedIOException(e);
    }
    if (!Files.isRegularFile(script)) {
      skipReason = "seed planner not found at " + script;
    } else if (!pythonWithNumpy()) {
      skipReason = "python3 with numpy is not available (python3 -c 'import numpy' failed)";
    }
    if (skipReason != null) {
      System.out.println("Skipping comparison with the seed planner: " + skipReason);
    }
  }

  @Test
  void matchesTheSeedOnRandomValidRequests(@TempDir Path dir) throws Exception {
    assumeTrue(skipReason == null, skipReason);
    System.out.println("random seed " + SEED);
    Random random = new Random(SEED);
    List<String> inputs = new ArrayList<>();
    for (int i = 0; i < REQUESTS; i++) {
      inputs.add(randomRequest(random));
    }
    Path inputFile = dir.resolve("requests.jsonl");
    Files.write(inputFile, inputs, UTF_8);
    Path driver = dir.resolve("driver.py");
    Files.writeString(driver, DRIVER, UTF_8);

    List<String> seedOutputs =
        python(dir, inputFile, "python3", driver.toString(), script.toString()).lines().toList();

    assertEquals(REQUESTS, seedOutputs.size());
    for (int i = 0; i < REQUESTS; i++) {
      PlanCommandTest.Result ours = PlanCommandTest.runPlan(inputs.get(i));
      assertEquals(0, ours.exitCode(), ours.err());
      assertEquals(seedOutputs.get(i), ours.out().strip(), "request " + i + ": " + inputs.get(i));
    }
  }

  @Test
  void matchesTheSeedScriptRunAsIs(@TempDir Path dir) throws Exception {
    assumeTrue(skipReason == null, skipReason);
    Random random = new Random(SEED + 1);
    for (int i = 0; i < THROUGH_THE_SCRIPT_AS_IS; i++) {
      String input = randomRequest(random);
      Path inputFile = dir.resolve("request-" + i + ".json");
      Files.writeString(inputFile, input, UTF_8);

      String seedOutput = python(dir, inputFile, "python3", script.toString());

      PlanCommandTest.Result ours = PlanCommandTest.runPlan(input);
      assertEquals(0, ours.exitCode(), ours.err());
      assertEquals(seedOutput.strip(), ours.out().strip(), input);
    }
  }

  /** A valid request: standard or MLA, remote cache often of another size, ids in runs or not. */
  static String randomRequest(Random random) {
    boolean mla = random.nextInt(3) == 0;
    int numBlocks = 1 + random.nextInt(random.nextBoolean() ? 40 : 3000);
    boolean remoteGiven = random.nextInt(4) != 0;
    int remoteNumBlocks =
        remoteGiven ? 1 + random.nextInt(random.nextBoolean() ? 40 : 3000) : numBlocks;
    int n = Math.min(random.nextInt(150), Math.min(numBlocks, remoteNumBlocks));
    int[] local;
    int[] remote;
    switch (random.nextInt(4)) {
      case 0 -> { // runs, in order
        local = BlockIdSamples.runs(random, n, numBlocks, 5);
        remote = BlockIdSamples.runs(random, n, remoteNumBlocks, 5);
      }
      case 1 -> { // runs, shuffled
        local = BlockIdSamples.runs(random, n, numBlocks, 5);
        remote = BlockIdSamples.runs(random, n, remoteNumBlocks, 5);
        BlockIdSamples.shuffleTogether(random, local, remote);
      }
      case 2 -> { // the last block of each side, then block 0: K's end meets V's start
        n = Math.min(n, 2);
        local = n == 2 ? new int[] {numBlocks - 1, 0} : new int[n];
        remote = n == 2 ? new int[] {remoteNumBlocks - 1, 0} : new int[n];
      }
      default -> { // scattered
        local = BlockIdSamples.distinct(random, n, numBlocks);
        remote = BlockIdSamples.distinct(random, n, remoteNumBlocks);
      }
    }
    StringBuilder json = new StringBuilder("{");
    json.append("\"layout\": \"").append(mla ? "mla" : "standard").append("\"");
    json.append(", \"num_blocks\": ").append(numBlocks);
    if (remoteGiven) {
      json.append(", \"remote_num_blocks\": ").append(remoteNumBlocks);
    }
    json.append(", \"block_size\": ").append(new int[] {1, 16, 32, 64}[random.nextInt(4)]);
    if (!mla || random.nextBoolean()) {
      json.append(", \"kv_heads\": ").append(1 + random.nextInt(8));
      json.append(", \"head_dim\": ").append(new int[] {64, 128, 7}[random.nextInt(3)]);
    }
    if (mla || random.nextBoolean()) {
      json.append(", \"latent\": ").append(new int[] {576, 512, 3}[random.nextInt(3)]);
    }
    json.append(", \"elem_size\": ").append(new int[] {1, 2, 4}[random.nextInt(3)]);
    json.append(", \"local_block_ids\": ").append(list(local));
    json.append(", \"remote_block_ids\": ").append(list(remote));
    return json.append('}').toString();
  }




  private static String list(int[] ids) {
    StringJoiner joiner = new StringJoiner(", ", "[", "]");
    for (int id : ids) {
      joiner.add(Integer.toString(id));
    }
    return joiner.toString();
  }

  private static boolean pythonWithNumpy() {
    try {
      Process p =
          new ProcessBuilder("python3", "-c", "import numpy")
              .redirectErrorStream(true)
              .redirectOutput(ProcessBuilder.Redirect.DISCARD)
              .start();
      return p.waitFor(60, TimeUnit.SECONDS) && p.exitValue() == 0;
    } catch (IOException e) {
      return false;
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      return false;
    }
  }

  /** Runs a Python command with {@code stdin} as its input; returns its stdout. */
  private static String python(Path dir, Path stdin, String... command) throws Exception {
    Path out = Files.createTempFile(dir, "out", ".txt");
    Path err = Files.createTempFile(dir, "err", ".txt");
    Process p =
        new ProcessBuilder(command)
            .redirectInput(stdin.toFile())
            .redirectOutput(out.toFile())
            .redirectError(err.toFile())
            .start();
    assertTrue(p.waitFor(120, TimeUnit.SECONDS), "python did not finish: " + List.of(command));
    assertEquals(0, p.exitValue(), Files.readString(err));
    return Files.readString(out);
  }
}
