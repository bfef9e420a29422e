package dev.kvferry.rdma;

import java.io.IOException;
import java.util.List;

/** Opens a {@link Transport} by the name used in config and CLI flags. */
public final class Transports {

  /** The names {@link #open} knows, in the order to suggest them. */
  public static final List<String> NAMES = List.of("local", "cma", "tcp", "cuda", "ucx");

  private Transports() {}

  /**
   * Opens the named transport for the regions of {@code registry}.
   *
   * <ul>
   *   <li>{@code local}: peers in this process ({@code registry} is the one reachable registry)
   *   <li>{@code cma}: processes on this host, through process_vm_writev/readv
   *   <li>{@code tcp}: any host; listens per {@code options} and serves {@code registry}
   *   <li>{@code cuda}: GPU memory of processes on this host, through CUDA IPC (needs a GPU)
   *   <li>{@code ucx}: any host, through UCX's put/get (verbs on RDMA hardware, shared memory or
   *       TCP elsewhere; the transports UCX may use: {@link TransportOptions#ucxTransports()})
   * </ul>
   *
   * @throws IllegalArgumentException for an unknown name; the message lists the valid ones
   * @throws IOException when the tcp listener cannot bind
   * @throws dev.kvferry.rdma.cuda.CudaUnavailableException for {@code cuda} on a host without CUDA
   * @throws dev.kvferry.rdma.ucx.UcxUnavailableException for {@code ucx} on a host without libucp
   * @throws dev.kvferry.rdma.ucx.UcxException when UCX cannot open a context or worker
   */
  public static Transport open(String name, RegionRegistry registry, TransportOptions options)
      throws IOException {
    if (name == null) {
      throw new IllegalArgumentException("no transport name given; valid: " + String.join(", ", NAMES));
    }
    return switch (name) {
      case "local" -> new LocalTransport(registry);
      case "cma" -> new CmaTransport(options);
      case "tcp" -> new TcpTransport(registry, options);
      case "cuda" -> new CudaTransport(CudaTransport.CopyMethod.configured());
      case "ucx" -> new UcxTransport(options);
      default -> throw new IllegalArgumentException(
          "unknown transport '" + name + "'; valid: " + String.join(", ", NAMES));
    };
  }
}
