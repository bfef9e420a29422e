package dev.kvferry.rdma.cuda;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assumptions.assumeFalse;
import static org.junit.jupiter.api.Assumptions.assumeTrue;

import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

class CudaProbeTest {

  @BeforeAll
  static void sayWhetherCudaIsHere() {
    System.out.println(Cuda.available()
        ? "CUDA available: " + Cuda.deviceCount() + " device(s)"
        : "CUDA not available here (" + Cuda.unavailableReason() + "); GPU tests are skipped");
  }

  @Test
  void explainsWhyCudaIsUnavailable() {
    assumeFalse(Cuda.available(), "this host has CUDA");
    String reason = Cuda.unavailableReason();
    assertNotNull(reason);
    assertFalse(reason.isBlank());
    CudaUnavailableException e = assertThrows(CudaUnavailableException.class, Cuda::require);
    assertEquals("CUDA not available: " + reason, e.getMessage());
    assertThrows(CudaUnavailableException.class, () -> Cuda.malloc(1024));
    assertFalse(Cuda.hasMemcpyBatch());
  }

  @Test
  void probeOnAGpuHostFindsDevicesAndLoadsTheKernels() {
    assumeTrue(Cuda.available(), () -> "CUDA not available: " + Cuda.unavailableReason());
    assertNull(Cuda.unavailableReason());
    assertTrue(Cuda.deviceCount() > 0);
    assertTrue(CudaKernels.forDevice(0).multiProcessors() > 0);
  }

  @Test
  void errorsNameTheCallAndTheError() {
    CudaException e = new CudaException("cudaIpcOpenMemHandle", 1, "cudaErrorInvalidValue");
    assertEquals("cudaIpcOpenMemHandle failed: cudaErrorInvalidValue (1)", e.getMessage());
  }

  @Test
  void kernelPtxShipsInTheJarWithItsEntryPoints() {
    String ptx = new String(CudaKernels.ptx(), java.nio.charset.StandardCharsets.US_ASCII);
    assertTrue(ptx.contains(".entry kvferry_scatter_copy("));
    // The simulator's kernels ship with the simulator (sim's SimKernels), not with the runtime.
    assertFalse(ptx.contains("kvferry_fill_pattern"));
    assertFalse(ptx.contains("kvferry_kv_fill"));
  }
}
