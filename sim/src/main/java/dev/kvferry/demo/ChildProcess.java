package dev.kvferry.demo;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.TimeUnit;

/**
 * A kvferry process started by the demo (or a test): same Java, same classpath, its output in a
 * log file. Stopped with SIGTERM so it leaves the cluster cleanly, then killed if it lingers.
 */
public final class ChildProcess implements AutoCloseable {
  private final String name;
  private final Process process;
  private final Path log;
  private volatile boolean stoppedByUs;
  private volatile long exitedAtNanos;

  private ChildProcess(String name, Process process, Path log) {
    this.name = name;
    this.process = process;
    this.log = log;
    process.onExit().thenRun(() -> exitedAtNanos = System.nanoTime());
  }

  /** Starts {@code kvferry <args>} in a new JVM; stdout and stderr go to {@code logDir/name.log}. */
  public static ChildProcess start(String name, Path logDir, List<String> jvmArgs, List<String> args)
      throws IOException {
    return start(name, logDir, List.of(), jvmArgs, args);
  }

  /**
   * As {@link #start(String, Path, List, List)}, the JVM started through {@code commandPrefix}
   * (e.g. {@code ip netns exec NS}, which execs, so the process is still the JVM).
   */
  public static ChildProcess start(String name, Path logDir, List<String> commandPrefix,
      List<String> jvmArgs, List<String> args) throws IOException {
    Files.createDirectories(logDir);
    Path log = logDir.resolve(name + ".log");
    List<String> cmd = new ArrayList<>(commandPrefix);
    cmd.add(javaExecutable());
    cmd.addAll(jvmArgs);
    String archive = System.getProperty("kvferry.cds.archive", "");
    if (!archive.isEmpty() && Files.isReadable(Path.of(archive))) {
      // The launcher's class-data archive: roughly halves start-up (see CdsWarmupCommand).
      cmd.add("-XX:SharedArchiveFile=" + archive);
      cmd.add("-Xlog:cds=off");
      cmd.add("-Xlog:cds+dynamic=off");
    }
    cmd.add("-cp");
    cmd.add(System.getProperty("java.class.path"));
    // The kvferry command (module cli): on the class path of kvferry.jar and of the tests.
    cmd.add("dev.kvferry.cli.KvferryCli");
    cmd.addAll(args);
    Process p =
        new ProcessBuilder(cmd)
            .redirectErrorStream(true)
            .redirectOutput(log.toFile())
            .start();
    return new ChildProcess(name, p, log);
  }

  /**
   * The java of this JVM ({@code java.home}), not the first on the PATH: a bundled runtime
   * (a GPU host without Java) starts its children with itself.
   */
  static String javaExecutable() {
    Path java = Path.of(System.getProperty("java.home"), "bin", "java");
    return Files.isExecutable(java)
        ? java.toString()
        : ProcessHandle.current().info().command().orElse("java");
  }

  public String name() {
    return name;
  }

  public Path log() {
    return log;
  }

  public long pid() {
    return process.pid();
  }

  public boolean isAlive() {
    return process.isAlive();
  }

  /** SIGKILL ({@code kill -9}), no goodbye: for fault tests. Returns once the process is gone. */
  public void kill() throws InterruptedException {
    stoppedByUs = true;
    process.destroyForcibly().waitFor();
  }

  /**
   * From now on the caller expects this process to end by itself (a node its cluster is about to
   * down): waits for other processes then do not fail when it exits.
   */
  public void expectExit() {
    stoppedByUs = true;
  }

  /** {@link System#nanoTime()} when the process was seen to end, or 0 while it runs. */
  public long exitedAtNanos() {
    return exitedAtNanos;
  }

  /**
   * Waits up to {@code timeout} for a process the caller expects to end by itself (a node its
   * cluster downed); whether it did. An exit waited for here is not {@link #exitedUnexpectedly}.
   */
  public boolean awaitExpectedExit(java.time.Duration timeout) throws InterruptedException {
    boolean ended = process.waitFor(timeout.toMillis(), java.util.concurrent.TimeUnit.MILLISECONDS);
    if (ended) {
      stoppedByUs = true;
    }
    return ended;
  }

  /**
   * How the process ended, for error messages: its exit code, or the signal that killed it (a
   * SIGKILL the demo did not send is most likely the kernel's out-of-memory killer), or a Java
   * OutOfMemoryError its log shows; "is running" while it runs.
   */
  public String exitDescription() {
    if (process.isAlive()) {
      return name + " is running";
    }
    boolean javaOom = false;
    try {
      javaOom = Files.exists(log) && Files.readString(log).contains("java.lang.OutOfMemoryError");
    } catch (IOException | RuntimeException e) {
      // no log to read: the exit status says enough
    }
    return name + " " + describeExit(process.exitValue(), stoppedByUs, javaOom);
  }

  /**
   * Words for an exit status as Java reports it: 128 + n for a process killed by signal n.
   *
   * @param stoppedByUs whether this program sent the stop (SIGTERM or SIGKILL) itself
   * @param javaOutOfMemory whether the process's log shows a java.lang.OutOfMemoryError
   */
  static String describeExit(int status, boolean stoppedByUs, boolean javaOutOfMemory) {
    if (javaOutOfMemory) {
      return "ran out of Java heap (java.lang.OutOfMemoryError in its log; exit status " + status
          + ")";
    }
    if (status > 128 && status <= 128 + 64) {
      int signal = status - 128;
      String name = switch (signal) {
        case 1 -> "SIGHUP";
        case 2 -> "SIGINT";
        case 6 -> "SIGABRT";
        case 9 -> "SIGKILL";
        case 11 -> "SIGSEGV";
        case 15 -> "SIGTERM";
        default -> "signal " + signal;
      };
      String how = "was killed by " + name + " (signal " + signal + ")";
      if (signal == 9 && !stoppedByUs) {
        return how + ", not by kvferry: most likely the kernel's out-of-memory killer (see"
            + " dmesg or journalctl -k for \"Out of memory\")";
      }
      return how;
    }
    return "exited with code " + status;
  }

  /** Whether the process ended without being killed or closed by us. */
  public boolean exitedUnexpectedly() {
    return !stoppedByUs && !process.isAlive();
  }

  /**
   * Waits until the log holds {@code text} (the process printed that it is up).
   *
   * @throws IllegalStateException naming the log when the process exits first or time runs out
   */
  public void awaitLog(String text, java.time.Duration timeout) throws InterruptedException {
    long deadline = System.nanoTime() + timeout.toNanos();
    while (System.nanoTime() < deadline) {
      try {
        if (Files.exists(log) && Files.readString(log).contains(text)) {
          return;
        }
      } catch (IOException | java.io.UncheckedIOException e) {
        // the log is being written: read again
      }
      if (!process.isAlive()) {
        throw new IllegalStateException(exitDescription() + " before it was up; its log (" + log
            + ") ends with:\n" + tail(20));
      }
      TimeUnit.MILLISECONDS.sleep(100);
    }
    throw new IllegalStateException(name + " was not up within " + timeout.toSeconds()
        + " s; its log (" + log + ") ends with:\n" + tail(20));
  }

  /** The last lines of the log, for error messages. */
  public String tail(int lines) {
    try {
      List<String> all = Files.readAllLines(log);
      return String.join("\n", all.subList(Math.max(0, all.size() - lines), all.size()));
    } catch (IOException e) {
      return "(no log: " + e.getMessage() + ")";
    }
  }

  @Override
  public void close() {
    stoppedByUs = true;
    if (!process.isAlive()) {
      return;
    }
    process.destroy();
    try {
      if (!process.waitFor(20, TimeUnit.SECONDS)) {
        process.destroyForcibly().waitFor(10, TimeUnit.SECONDS);
      }
    } catch (InterruptedException e) {
      process.destroyForcibly();
      Thread.currentThread().interrupt();
    }
  }
}
