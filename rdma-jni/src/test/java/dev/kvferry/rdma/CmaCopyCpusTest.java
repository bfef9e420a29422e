package dev.kvferry.rdma;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assumptions.assumeTrue;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.stream.Stream;
import org.junit.jupiter.api.Test;

/**
 * The cma I/O threads pinned to the configured CPUs: each copy thread runs only on its CPU (as
 * the kernel reports it for the thread), copies still land whole, and a CPU the process may not
 * use is refused when the transport opens, naming it.
 */
class CmaCopyCpusTest {
  private static final int LENGTH = 8 << 20; // shared between the copy threads

  @Test
  void copyThreadsRunOnlyOnTheirCpusAndCopiesLandWhole() throws IOException {
    int[] allowed = CpuAffinity.allowedCpus();
    assumeTrue(allowed.length >= 2, "one CPU: nothing to spread the copy threads over");
    int[] cpus = {allowed[1], allowed[0]};
    try (RegionRegistry ours = new RegionRegistry("P0");
        RegionRegistry peer = new RegionRegistry("D0");
        CmaTransport cma = new CmaTransport(
            TransportOptions.defaults().withCmaCopyThreads(2).withCmaCopyCpus(cpus))) {
      MemoryRegion src = ours.allocateHost(LENGTH);
      MemoryRegion dst = peer.allocateHost(LENGTH);
      Patterns.fill(src, 0, LENGTH, 7);
      TransferBatch whole = new TransferBatch(new long[] {0}, new long[] {0}, new long[] {LENGTH});
      TransferStatus s = Patterns.await(cma.write(src, dst.descriptor(), whole));
      assertTrue(s.succeeded(), s::toString);
      assertEquals(Patterns.crc(src, 0, LENGTH), Patterns.crc(dst, 0, LENGTH));
      // Threads of other transports in this JVM share the name and run anywhere ("0-1"): ours
      // are the ones allowed a single CPU, one per configured CPU.
      List<String> single = copyThreadCpus().stream().filter(c -> c.matches("\\d+")).sorted().toList();
      List<String> expected = java.util.stream.IntStream.of(cpus).mapToObj(Integer::toString)
          .sorted().toList();
      assertEquals(expected, single, "the copy threads' CPUs as the kernel reports them");
    }
  }

  @Test
  void aCpuTheProcessMayNotUseIsRefusedNamingIt() {
    int[] allowed = CpuAffinity.allowedCpus();
    assumeTrue(allowed.length >= 1 && allowed[allowed.length - 1] < TransportOptions.CPU_IDS - 1,
        "every CPU id is allowed here");
    int notAllowed = TransportOptions.CPU_IDS - 1;
    IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
        () -> new CmaTransport(TransportOptions.defaults().withCmaCopyCpus(notAllowed)).close());
    assertTrue(e.getMessage().contains("CPU " + notAllowed + " is not one this process may run on"),
        e.getMessage());
  }

  @Test
  void cpuIdsOutsideTheRangeAreRefused() {
    assertThrows(IllegalArgumentException.class,
        () -> TransportOptions.defaults().withCmaCopyCpus(-1));
    assertThrows(IllegalArgumentException.class,
        () -> TransportOptions.defaults().withCmaCopyCpus(TransportOptions.CPU_IDS));
  }

  /** Cpus_allowed_list of each of this process's cma I/O threads. */
  private static List<String> copyThreadCpus() throws IOException {
    List<String> out = new ArrayList<>();
    try (Stream<Path> tasks = Files.list(Path.of("/proc/self/task"))) {
      for (Path task : (Iterable<Path>) tasks::iterator) {
        String comm;
        List<String> status;
        try {
          comm = Files.readString(task.resolve("comm")).trim();
          status = Files.readAllLines(task.resolve("status"));
        } catch (IOException gone) {
          continue; // the thread ended while we looked
        }
        if (comm.startsWith("kvferry-cma-io")) {
          for (String line : status) {
            if (line.startsWith("Cpus_allowed_list:")) {
              out.add(line.substring(line.indexOf(':') + 1).trim());
            }
          }
        }
      }
    }
    return out;
  }
}
