package dev.kvferry.cli;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assumptions.assumeFalse;
import static org.junit.jupiter.api.Assumptions.assumeTrue;

import dev.kvferry.rdma.cuda.Cuda;
import java.io.PrintWriter;
import java.io.StringWriter;
import org.junit.jupiter.api.Test;
import picocli.CommandLine;

/** The demo's and the node's GPU flags fail fast, before any JVM or actor system starts. */
class GpuCommandsTest {

  private record Result(int code, String err) {}

  private static Result run(String... args) {
    CommandLine cli = KvferryCli.newCommandLine();
    StringWriter err = new StringWriter();
    cli.setErr(new PrintWriter(err, true));
    int code = cli.execute(args);
    return new Result(code, err.toString());
  }

  @Test
  void demoOnGpusWithoutCudaSaysWhy() {
    assumeFalse(Cuda.available(), "this host has CUDA");
    Result r = run("demo", "--p-gpu", "0", "--d-gpu", "1");
    assertEquals(2, r.code());
    assertTrue(r.err().contains("kvferry demo: CUDA not available: " + Cuda.unavailableReason()),
        r.err());
  }

  @Test
  void demoOnAGpuThisHostLacksNamesTheDevices() {
    assumeTrue(Cuda.available(), () -> "CUDA not available: " + Cuda.unavailableReason());
    Result r = run("demo", "--p-gpu", "0", "--d-gpu", "99");
    assertEquals(2, r.code());
    assertTrue(r.err().contains("GPU 99 does not exist"), r.err());
  }

  @Test
  void demoRefusesAGpuForOneSideOnly() {
    Result r = run("demo", "--p-gpu", "0");
    assertEquals(2, r.code());
    assertTrue(r.err().contains("--p-gpu and --d-gpu go together"), r.err());
  }

  @Test
  void demoRefusesAHostTransportForGpus() {
    Result r = run("demo", "--p-gpu", "0", "--d-gpu", "0", "--transport", "cma");
    assertEquals(2, r.code());
    assertTrue(r.err().contains("not cma"), r.err());
  }

  @Test
  void nodeOnAGpuWithoutCudaSaysWhy() {
    assumeFalse(Cuda.available(), "this host has CUDA");
    Result r = run("node", "--role", "prefill", "--gpu", "0");
    assertEquals(2, r.code());
    assertTrue(r.err().contains("kvferry node: --gpu 0: CUDA not available: "), r.err());
  }
}
