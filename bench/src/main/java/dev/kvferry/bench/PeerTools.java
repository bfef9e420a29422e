package dev.kvferry.bench;

import java.io.IOException;
import java.io.InputStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardCopyOption;
import java.time.Duration;
import java.util.List;
import java.util.concurrent.TimeUnit;
import org.jspecify.annotations.Nullable;

/**
 * Finds and runs the peer programs kvferry is compared with: kvferry's own peers (the memcpy
 * ceiling in C, the seed's planner and notify stack in Python; {@link #BUNDLED_PEERS}), gcc, iperf3
 * and the two Pythons. Installs nothing: a missing tool is reported with
 * the Debian package that provides it.
 */
public final class PeerTools {

  /** A peer that cannot run here, and how to fix that. */
  public static final class MissingPeerException extends Exception {
    private static final long serialVersionUID = 1L;

    public MissingPeerException(String message) {
      super(message);
    }
  }

  /** What a finished program printed. */
  public record Output(int exitCode, String stdout, String stderr) {
    /** The last non-empty stdout line (the peers print their JSON last). */
    public String lastLine() {
      String[] lines = stdout.strip().split("\\R");
      return lines[lines.length - 1];
    }
  }

  private final Path peersDir;
  private final Path workDir;

  /**
   * @param peersDir where memcpy_ceiling.c, seed_planner.py and seed_notify_rtt.py live
   * @param workDir scratch space for compiled peers and input files
   */
  public PeerTools(Path peersDir, Path workDir) {
    this.peersDir = peersDir;
    this.workDir = workDir;
  }

  /** The peer programs kvferry keeps (classpath resources beside this class, {@code peers/}). */
  public static final List<String> BUNDLED_PEERS =
      List.of("memcpy_ceiling.c", "seed_planner.py", "seed_notify_rtt.py");

  /**
   * The peers folder: {@code explicit} if given (for example {@code ../shared/peers}, to compare
   * with other copies of the peers), else kvferry's own peers, written into {@code scratch/peers}.
   */
  public static Path locatePeers(@Nullable Path explicit, Path scratch) throws IOException {
    if (explicit != null) {
      return explicit;
    }
    Path dir = Files.createDirectories(scratch.resolve("peers"));
    for (String name : BUNDLED_PEERS) {
      try (InputStream in = PeerTools.class.getResourceAsStream("peers/" + name)) {
        if (in == null) {
          throw new IOException("kvferry's peer " + name + " is missing from the class path");
        }
        Files.copy(in, dir.resolve(name), StandardCopyOption.REPLACE_EXISTING);
      }
    }
    return dir;
  }

  public Path peersDir() {
    return peersDir;
  }

  public Path workDir() {
    return workDir;
  }

  /** A file of the peers folder, or why it is missing. */
  public Path peerFile(String name) throws MissingPeerException {
    Path p = peersDir.resolve(name);
    if (!Files.isRegularFile(p)) {
      throw new MissingPeerException(
          name + " not found in " + peersDir + " (--peers DIR names a folder with "
              + String.join(", ", BUNDLED_PEERS) + "; without it kvferry uses its own)");
    }
    return p;
  }

  /** Compiles memcpy_ceiling.c with {@code gcc -O2} once per run. */
  public Path memcpyCeiling() throws MissingPeerException, IOException {
    Path binary = workDir.resolve("memcpy_ceiling");
    if (Files.isExecutable(binary)) {
      return binary;
    }
    Path source = peerFile("memcpy_ceiling.c");
    requireCommand("gcc", "gcc");
    Output o = run(List.of("gcc", "-O2", "-o", binary.toString(), source.toString()),
        null, Duration.ofSeconds(120));
    if (o.exitCode() != 0) {
      throw new IOException("gcc failed on " + source + ": " + o.stderr().strip());
    }
    return binary;
  }

  /** {@code iperf3}, or why not. */
  public String iperf3() throws MissingPeerException {
    return requireCommand("iperf3", "iperf3");
  }

  /** A python3 that imports numpy (the planner seed): {@code python3} on PATH first, then Debian's. */
  public String pythonWithNumpy() throws MissingPeerException {
    for (String python : List.of("python3", "/usr/bin/python3")) {
      if (imports(python, "numpy")) {
        return python;
      }
    }
    throw new MissingPeerException(
        "no python3 with numpy found: apt-get install -y python3-numpy");
  }

  /** Debian's python3 with zmq and msgpack (the notify seed's stack). */
  public String pythonWithZmq() throws MissingPeerException {
    String python = "/usr/bin/python3";
    if (!Files.isExecutable(Path.of(python))) {
      throw new MissingPeerException("/usr/bin/python3 not found: apt-get install -y python3 "
          + "python3-zmq python3-msgpack");
    }
    if (!imports(python, "zmq, msgpack")) {
      throw new MissingPeerException(
          "/usr/bin/python3 cannot import zmq and msgpack: apt-get install -y python3-zmq "
              + "python3-msgpack");
    }
    return python;
  }

  private static boolean imports(String python, String modules) {
    try {
      return run(List.of(python, "-c", "import " + modules), null, Duration.ofSeconds(30))
          .exitCode() == 0;
    } catch (IOException e) {
      return false; // not installed
    }
  }

  private static String requireCommand(String command, String debianPackage)
      throws MissingPeerException {
    return requireCommand(command, debianPackage, System.getenv("PATH"));
  }

  /** {@code command}'s path on {@code path} (a PATH value), or which Debian package provides it. */
  static String requireCommand(String command, String debianPackage, String path)
      throws MissingPeerException {
    if (path != null) {
      for (String dir : path.split(java.io.File.pathSeparator)) {
        if (!dir.isEmpty() && Files.isExecutable(Path.of(dir, command))) {
          return Path.of(dir, command).toString();
        }
      }
    }
    throw new MissingPeerException(
        command + " not found on PATH: apt-get install -y " + debianPackage);
  }

  /**
   * Runs a program to its end, feeding {@code stdin} (may be null), and returns what it printed.
   *
   * @throws IOException when it cannot start or outlives {@code timeout} (it is then killed)
   */
  public static Output run(List<String> command, byte[] stdin, Duration timeout)
      throws IOException {
    Path out = Files.createTempFile("kvferry-bench-", ".out");
    Path err = Files.createTempFile("kvferry-bench-", ".err");
    try {
      ProcessBuilder pb = new ProcessBuilder(command)
          .redirectOutput(out.toFile())
          .redirectError(err.toFile());
      if (stdin == null) {
        pb.redirectInput(ProcessBuilder.Redirect.from(Path.of("/dev/null").toFile()));
      }
      Process p = pb.start();
      if (stdin != null) {
        try (var in = p.getOutputStream()) {
          in.write(stdin);
        }
      }
      if (!p.waitFor(timeout.toMillis(), TimeUnit.MILLISECONDS)) {
        p.destroyForcibly();
        throw new IOException(String.join(" ", command) + " did not finish within " + timeout);
      }
      return new Output(p.exitValue(), Files.readString(out, StandardCharsets.UTF_8),
          Files.readString(err, StandardCharsets.UTF_8));
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw new IOException("interrupted while running " + command.get(0), e);
    } finally {
      Files.deleteIfExists(out);
      Files.deleteIfExists(err);
    }
  }
}
