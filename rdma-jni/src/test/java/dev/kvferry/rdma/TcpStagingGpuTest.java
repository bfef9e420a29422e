package dev.kvferry.rdma;

import static org.junit.jupiter.api.Assumptions.assumeTrue;

import dev.kvferry.rdma.cuda.Cuda;
import dev.kvferry.rdma.testing.TcpGpuChecks;
import java.util.stream.Stream;
import org.junit.jupiter.api.Named;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.Arguments;
import org.junit.jupiter.params.provider.MethodSource;

/**
 * GPU memory over tcp on loopback, staged through pinned buffers: the cases of {@link
 * TcpGpuChecks} (every byte checked at the destination), P and D on GPU 0. Each is skipped, with
 * the reason, on a host without CUDA; on a GPU host without Maven, {@code scripts/gpu-tcp.sh} runs
 * the same cases.
 */
class TcpStagingGpuTest {

  static Stream<Arguments> cases() {
    return TcpGpuChecks.checks(0, 0).stream().map(c -> Arguments.of(Named.of(c.name(), c)));
  }

  @ParameterizedTest(name = "{0}")
  @MethodSource("cases")
  void movesGpuMemoryOverTcpThroughPinnedBuffers(TcpGpuChecks.Check check) throws Exception {
    assumeTrue(Cuda.available(), () -> "CUDA not available: " + Cuda.unavailableReason());
    check.body().run();
  }
}
