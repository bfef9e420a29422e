package dev.kvferry.rdma.testing;

import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStreamReader;
import java.io.OutputStreamWriter;
import java.io.Writer;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;

/**
 * A second JVM on this host running a main class of our classpath, driven through its stdin and
 * stdout one line at a time: the peer process of cross-process tests and benchmarks. Its stderr
 * goes to a temporary file whose tail is quoted when it misbehaves.
 */
public final class ChildJvm implements AutoCloseable {
  private static final String EOF = "\u0000eof";

  private final Process process;
  private final Writer stdin;
  private final BlockingQueue<String> lines = new LinkedBlockingQueue<>();
  private final Path stderr;
  private final String mainClass;

  private ChildJvm(Process process, Path stderr, String mainClass) {
    this.process = process;
    this.stderr = stderr;
    this.mainClass = mainClass;
    this.stdin = new OutputStreamWriter(process.getOutputStream(), StandardCharsets.UTF_8);
    Thread reader = new Thread(this::pump, "child-jvm-" + process.pid() + "-stdout");
    reader.setDaemon(true);
    reader.start();
  }

  /**
   * Starts {@code java <jvmOptions> -cp <our classpath> <mainClass> <args>} with the java binary
   * that runs this JVM.
   */
  public static ChildJvm start(String mainClass, List<String> jvmOptions, List<String> args)
      throws IOException {
    return start(mainClass, jvmOptions, args, Map.of());
  }

  /**
   * As {@link #start(String, List, List)}, with {@code environment} added to (or replacing in)
   * this JVM's environment: how a test gives the child settings a native library reads from its
   * environment, such as UCX_TLS.
   */
  public static ChildJvm start(
      String mainClass, List<String> jvmOptions, List<String> args, Map<String, String> environment)
      throws IOException {
    String java =
        ProcessHandle.current()
            .info()
            .command()
            .orElse(Path.of(System.getProperty("java.home"), "bin", "java").toString());
    List<String> command = new ArrayList<>();
    command.add(java);
    command.addAll(jvmOptions);
    command.add("-cp");
    command.add(System.getProperty("java.class.path"));
    command.add(mainClass);
    command.addAll(args);
    Path stderr = Files.createTempFile("kvferry-child-", ".stderr");
    ProcessBuilder builder =
        new ProcessBuilder(command)
            .redirectError(stderr.toFile())
            .redirectInput(ProcessBuilder.Redirect.PIPE);
    builder.environment().putAll(environment);
    Process process = builder.start();
    return new ChildJvm(process, stderr, mainClass);
  }

  public long pid() {
    return process.pid();
  }

  public boolean isAlive() {
    return process.isAlive();
  }

  /**
   * Waits for the next stdout line that starts with {@code prefix}, skipping others (log lines),
   * and returns the rest of it.
   *
   * @throws IOException when the child exits or stays silent past {@code timeout}
   */
  public String awaitLine(String prefix, Duration timeout) throws IOException {
    long deadline = System.nanoTime() + timeout.toNanos();
    while (true) {
      long left = deadline - System.nanoTime();
      String line;
      try {
        line = left <= 0 ? null : lines.poll(left, TimeUnit.NANOSECONDS);
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
        throw new IOException("interrupted while waiting for " + mainClass, e);
      }
      if (line == null) {
        throw new IOException(
            mainClass + " (pid " + pid() + ") printed no '" + prefix + "' line within " + timeout
                + "; its stderr ends with:\n" + stderrTail());
      }
      if (line.equals(EOF)) {
        lines.add(EOF);
        throw new IOException(
            mainClass + " (pid " + pid() + ") closed its stdout before printing '" + prefix
                + "'; its stderr ends with:\n" + stderrTail());
      }
      if (line.startsWith(prefix)) {
        return line.substring(prefix.length()).trim();
      }
    }
  }

  /** Sends one command line. */
  public void send(String command) throws IOException {
    stdin.write(command);
    stdin.write('\n');
    stdin.flush();
  }

  /** Sends a command and returns the rest of the first reply line that starts with {@code replyPrefix}. */
  public String request(String command, String replyPrefix, Duration timeout) throws IOException {
    send(command);
    return awaitLine(replyPrefix, timeout);
  }

  /** The last 2,000 characters the child wrote to stderr. */
  public String stderrTail() {
    try {
      String all = Files.readString(stderr, StandardCharsets.UTF_8);
      return all.length() <= 2000 ? all : all.substring(all.length() - 2000);
    } catch (IOException e) {
      return "(stderr unreadable: " + e.getMessage() + ")";
    }
  }

  /** Kills the child at once (as kill -9 would). */
  public void kill() {
    process.destroyForcibly();
  }

  /** Waits up to {@code timeout} for the child to exit; its exit code, or empty if still running. */
  public Optional<Integer> awaitExit(Duration timeout) {
    try {
      if (process.waitFor(timeout.toMillis(), TimeUnit.MILLISECONDS)) {
        return Optional.of(process.exitValue());
      }
      return Optional.empty();
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      return Optional.empty();
    }
  }

  /** Asks the child to exit (closes its stdin), then kills it if it lingers. */
  @Override
  public void close() {
    try {
      stdin.close();
    } catch (IOException ignored) {
      // the child may be gone already
    }
    if (awaitExit(Duration.ofSeconds(5)).isEmpty()) {
      process.destroyForcibly();
      awaitExit(Duration.ofSeconds(5));
    }
    try {
      Files.deleteIfExists(stderr);
    } catch (IOException ignored) {
      // a temp file left behind is harmless
    }
  }

  private void pump() {
    try (BufferedReader r =
        new BufferedReader(new InputStreamReader(process.getInputStream(), StandardCharsets.UTF_8))) {
      String line;
      while ((line = r.readLine()) != null) {
        lines.add(line);
      }
    } catch (IOException ignored) {
      // the child died; EOF below tells the waiters
    } finally {
      lines.add(EOF);
    }
  }
}
