package dev.kvferry.node;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assumptions.assumeFalse;

import dev.kvferry.rdma.cuda.Cuda;
import dev.kvferry.rdma.cuda.CudaUnavailableException;
import java.util.Map;
import org.junit.jupiter.api.Test;

/** Where a node keeps its KV cache: host memory by default, a GPU with kvferry.node.gpu. */
class GpuNodeSettingsTest {

  private static NodeSettings settings(Map<String, Object> node) {
    return NodeSettings.fromConfig(KvferryConfig.load(node));
  }

  @Test
  void kvCacheIsInHostMemoryByDefault() {
    NodeSettings s = settings(Map.of());
    assertEquals(-1, s.gpu());
    assertFalse(s.onGpu());
    assertEquals("cma", s.transport());
  }

  @Test
  void gpuWithTheTcpTransportIsAcceptedItStagesThroughPinnedBuffers() {
    NodeSettings s = settings(Map.of("kvferry.node.gpu", 0, "kvferry.node.transport", "tcp"));
    assertTrue(s.onGpu());
    assertEquals("tcp", s.transport());
  }

  @Test
  void tcpStagingComesFromTheNodeConfig() {
    NodeSettings defaults = settings(Map.of());
    assertEquals(2, defaults.transportOptions().tcpStagingBuffers());
    assertEquals(4 << 20, defaults.transportOptions().tcpStagingBufferBytes());
    NodeSettings s = settings(Map.of("kvferry.node.tcp.staging-buffers", 3,
        "kvferry.node.tcp.staging-buffer-bytes", "1 MiB"));
    assertEquals(3, s.transportOptions().tcpStagingBuffers());
    assertEquals(1 << 20, s.transportOptions().tcpStagingBufferBytes());
  }

  @Test
  void tcpStreamsComeFromTheNodeConfigAndTheIoThreadsGrowToMatch() {
    NodeSettings defaults = settings(Map.of());
    assertEquals(1, defaults.transportOptions().tcpStreams());
    NodeSettings s = settings(Map.of("kvferry.node.tcp.streams", 4));
    assertEquals(4, s.transportOptions().tcpStreams());
    assertEquals(4, s.transportOptions().ioThreads());
    IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
        () -> settings(Map.of("kvferry.node.tcp.streams", 0)));
    assertTrue(e.getMessage().contains("kvferry.node.tcp.streams must be in [1, 16], got 0"),
        e.getMessage());
  }

  @Test
  void cmaMapsPeerPagesUnlessTheNodeConfigSaysOff() {
    assertTrue(settings(Map.of()).transportOptions().cmaMapPeerPages());
    assertFalse(settings(Map.of("kvferry.node.cma.map-peer-pages", "off"))
        .transportOptions().cmaMapPeerPages());
  }

  @Test
  void cmaCopyThreadsComeFromTheNodeConfigAndTheIoThreadsGrowToMatch() {
    NodeSettings defaults = settings(Map.of());
    assertEquals(2, defaults.transportOptions().cmaCopyThreads());
    assertEquals(2, defaults.transportOptions().ioThreads());
    NodeSettings s = settings(Map.of("kvferry.node.cma.copy-threads", 3));
    assertEquals(3, s.transportOptions().cmaCopyThreads());
    assertEquals(3, s.transportOptions().ioThreads());
    assertEquals(1, settings(Map.of("kvferry.node.cma.copy-threads", 1))
        .transportOptions().cmaCopyThreads());
    IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
        () -> settings(Map.of("kvferry.node.cma.copy-threads", 0)));
    assertTrue(e.getMessage().contains("kvferry.node.cma.copy-threads must be in [1, 16], got 0"),
        e.getMessage());
  }

  @Test
  void gpuWithTheCudaTransportIsAccepted() {
    NodeSettings s = settings(Map.of("kvferry.node.gpu", 1, "kvferry.node.transport", "cuda"));
    assertTrue(s.onGpu());
    assertEquals(1, s.gpu());
  }

  @Test
  void gpuWithAHostTransportIsRefusedNamingTheFix() {
    IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
        () -> settings(Map.of("kvferry.node.gpu", 0)));
    assertTrue(e.getMessage().contains("kvferry.node.transport = \"cuda\"")
        && e.getMessage().contains("not \"cma\""), e.getMessage());
  }

  @Test
  void cudaTransportWithoutAGpuIsRefused() {
    IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
        () -> settings(Map.of("kvferry.node.transport", "cuda")));
    assertTrue(e.getMessage().contains("kvferry.node.gpu (--gpu N)"), e.getMessage());
  }

  @Test
  void nodeOnAGpuFailsFastWithoutCuda() {
    assumeFalse(Cuda.available(), "this host has CUDA");
    CudaUnavailableException e = assertThrows(CudaUnavailableException.class,
        () -> EngineNode.start(KvferryConfig.load(Map.of(
            "kvferry.node.gpu", 0, "kvferry.node.transport", "cuda",
            "pekko.remote.artery.canonical.port", 0))));
    assertEquals("CUDA not available: " + Cuda.unavailableReason(), e.getMessage());
  }
}
