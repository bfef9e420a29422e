package dev.kvferry.demo;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.file.Files;
import java.nio.file.Path;
import java.util.List;
import org.junit.jupiter.api.Test;

/** Putting the demo's P and D on GPUs, and how the demo starts its child JVMs. */
class GpuDemoOptionsTest {

  @Test
  void gpusSelectTheCudaTransportAndEachNodeItsDevice() {
    DemoOptions o = DemoOptions.defaults().withGpus(0, 1);
    assertEquals("cuda", o.transport());
    assertEquals(List.of("--transport", "cuda", "--gpu", "0"), o.kvCacheFlags(true));
    assertEquals(List.of("--transport", "cuda", "--gpu", "1"), o.kvCacheFlags(false));
    DemoOptions host = o.withGpus(-1, -1);
    assertEquals("cma", host.transport());
    assertEquals(List.of("--transport", "cma"), host.kvCacheFlags(true));
  }

  @Test
  void gpusKeepTcpWhenItWasChosen() {
    DemoOptions o = DemoOptions.defaults().withTransport("tcp").withGpus(0, 1);
    assertEquals(List.of("--transport", "tcp", "--gpu", "0"), o.kvCacheFlags(true));
  }

  @Test
  void oneGpuForBothSidesIsAllowed() {
    DemoOptions o = DemoOptions.defaults().withShapes(2, 1, 16, 32).withGpus(0, 0);
    assertEquals(0, o.pGpu());
    assertEquals(0, o.dGpu());
    assertEquals(2, o.tpP());
  }

  @Test
  void aGpuForOnlyOneSideIsRefused() {
    IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
        () -> DemoOptions.defaults().withGpus(0, -1));
    assertTrue(e.getMessage().contains("--p-gpu and --d-gpu go together"), e.getMessage());
  }

  @Test
  void cudaTransportWithoutGpusIsRefused() {
    IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
        () -> new DemoOptions("cuda", List.of("write"), 2, 2, 8, 4, 2, false, 8, 16, 16, 2, 1, 8,
            0, 0, 1, 1, false));
    assertTrue(e.getMessage().contains("give --p-gpu and --d-gpu"), e.getMessage());
  }

  @Test
  void childrenGetThisJvmsCudaLibraryPaths() {
    System.setProperty("kvferry.cuda.cudart", "/opt/cuda/libcudart.so.13");
    try {
      assertTrue(Demo.inheritedProperties().contains(
          "-Dkvferry.cuda.cudart=/opt/cuda/libcudart.so.13"), Demo.inheritedProperties().toString());
    } finally {
      System.clearProperty("kvferry.cuda.cudart");
    }
  }

  @Test
  void childrenRunThisJvmsJava() {
    Path expected = Path.of(System.getProperty("java.home"), "bin", "java");
    assertTrue(Files.isExecutable(expected));
    assertEquals(expected.toString(), ChildProcess.javaExecutable());
  }
}
