package dev.kvferry.rdma;

import java.time.Duration;
import java.util.Objects;

/**
 * Settings of the transports {@link Transports#open} builds. Immutable; start from {@link
 * #defaults()} (which work on one laptop) and change what you need with the {@code with...}
 * methods.
 */
public final class TransportOptions {

  private final String tcpBindHost;
  private final int tcpPort;
  private final String tcpAdvertisedHost;
  private final boolean tcpListen;
  private final int tcpSocketBufferBytes;
  private final Duration ioTimeout;
  private final int maxConnections;
  private final int ioThreads;
  private final long cmaInlineMaxBytes;
  private final int tcpStagingBuffers;
  private final int tcpStagingBufferBytes;
  private final String ucxTransports;
  private final int tcpStreams;
  private final boolean cmaMapPeerPages;
  private final int cmaCopyThreads;

  /** The most connections one tcp batch may be striped over. */
  public static final int MAX_TCP_STREAMS = 16;

  /** The most threads one cma copy may be shared by (more would only contend for memory). */
  public static final int MAX_CMA_COPY_THREADS = 16;

  /** Bounds of the staging knobs: a few buffers, each a page to 1 GiB (one tcp entry). */
  private static final int MAX_STAGING_BUFFERS = 16;
  private static final int MIN_STAGING_BUFFER_BYTES = 4096;
  private static final int MAX_STAGING_BUFFER_BYTES = 1 << 30;

  private TransportOptions(
      String tcpBindHost,
      int tcpPort,
      String tcpAdvertisedHost,
      boolean tcpListen,
      int tcpSocketBufferBytes,
      Duration ioTimeout,
      int maxConnections,
      int ioThreads,
      long cmaInlineMaxBytes,
      int tcpStagingBuffers,
      int tcpStagingBufferBytes,
      String ucxTransports,
      int tcpStreams,
      boolean cmaMapPeerPages,
      int cmaCopyThreads) {
    if (tcpPort < 0 || tcpPort > 65535) {
      throw new IllegalArgumentException("tcp port must be in [0, 65535], got " + tcpPort);
    }
    if (tcpSocketBufferBytes < 0 || maxConnections < 1 || ioThreads < 1 || cmaInlineMaxBytes < 0) {
      throw new IllegalArgumentException(
          "socket buffer, connection cap, io threads and inline bytes must be positive");
    }
    if (ioTimeout.isNegative() || ioTimeout.isZero()) {
      throw new IllegalArgumentException("io timeout must be positive, got " + ioTimeout);
    }
    if (tcpStagingBuffers < 1 || tcpStagingBuffers > MAX_STAGING_BUFFERS
        || tcpStagingBufferBytes < MIN_STAGING_BUFFER_BYTES
        || tcpStagingBufferBytes > MAX_STAGING_BUFFER_BYTES) {
      throw new IllegalArgumentException(
          "tcp staging needs 1.." + MAX_STAGING_BUFFERS + " buffers of " + MIN_STAGING_BUFFER_BYTES
              + ".." + MAX_STAGING_BUFFER_BYTES + " bytes, got " + tcpStagingBuffers + " of "
              + tcpStagingBufferBytes);
    }
    this.tcpBindHost = Objects.requireNonNull(tcpBindHost, "tcpBindHost");
    this.tcpPort = tcpPort;
    this.tcpAdvertisedHost = tcpAdvertisedHost == null ? "" : tcpAdvertisedHost;
    this.tcpListen = tcpListen;
    this.tcpSocketBufferBytes = tcpSocketBufferBytes;
    this.ioTimeout = ioTimeout;
    this.maxConnections = maxConnections;
    this.ioThreads = ioThreads;
    this.cmaInlineMaxBytes = cmaInlineMaxBytes;
    this.tcpStagingBuffers = tcpStagingBuffers;
    this.tcpStagingBufferBytes = tcpStagingBufferBytes;
    this.ucxTransports = Objects.requireNonNull(ucxTransports, "ucxTransports");
    if (tcpStreams < 1 || tcpStreams > MAX_TCP_STREAMS) {
      throw new IllegalArgumentException(
          "tcp streams must be in [1, " + MAX_TCP_STREAMS + "], got " + tcpStreams);
    }
    this.tcpStreams = tcpStreams;
    this.cmaMapPeerPages = cmaMapPeerPages;
    if (cmaCopyThreads < 1 || cmaCopyThreads > MAX_CMA_COPY_THREADS) {
      throw new IllegalArgumentException(
          "cma copy threads must be in [1, " + MAX_CMA_COPY_THREADS + "], got " + cmaCopyThreads);
    }
    this.cmaCopyThreads = cmaCopyThreads;
  }

  /**
   * Loopback listener on an ephemeral port, kernel-tuned socket buffers, 30 s without progress
   * fails a transfer, 64 connections, 2 I/O threads, CMA batches up to 1 MiB copied inline, GPU
   * memory staged for tcp through 2 pinned buffers of 4 MiB, mapped CMA copies of 4 MiB and more
   * shared by 2 of the I/O threads.
   */
  public static TransportOptions defaults() {
    return new TransportOptions(
        "127.0.0.1", 0, "", true, 0, Duration.ofSeconds(30), 64, 2, 1 << 20, 2, 4 << 20, "", 1, true, 2);
  }

  /** Where the TCP listener binds; port 0 picks a free port. */
  public TransportOptions withTcpBind(String host, int port) {
    return new TransportOptions(
        host, port, tcpAdvertisedHost, tcpListen, tcpSocketBufferBytes, ioTimeout, maxConnections,
        ioThreads, cmaInlineMaxBytes, tcpStagingBuffers, tcpStagingBufferBytes, ucxTransports,
        tcpStreams, cmaMapPeerPages, cmaCopyThreads);
  }

  /** The host peers should connect to, when it differs from the bind host (0.0.0.0, NAT). */
  public TransportOptions withTcpAdvertisedHost(String host) {
    return new TransportOptions(
        tcpBindHost, tcpPort, host, tcpListen, tcpSocketBufferBytes, ioTimeout, maxConnections,
        ioThreads, cmaInlineMaxBytes, tcpStagingBuffers, tcpStagingBufferBytes, ucxTransports,
        tcpStreams, cmaMapPeerPages, cmaCopyThreads);
  }

  /** Whether the TCP transport serves its registry's regions (false: client only). */
  public TransportOptions withTcpListener(boolean listen) {
    return new TransportOptions(
        tcpBindHost, tcpPort, tcpAdvertisedHost, listen, tcpSocketBufferBytes, ioTimeout,
        maxConnections, ioThreads, cmaInlineMaxBytes, tcpStagingBuffers, tcpStagingBufferBytes, ucxTransports,
        tcpStreams, cmaMapPeerPages, cmaCopyThreads);
  }

  /**
   * SO_SNDBUF/SO_RCVBUF for data sockets; 0 (the default) leaves the kernel's autotuning on,
   * which grows them past what a fixed size may ask for (net.core.rmem_max). On loopback, 256 KiB
   * to 4 MiB measured no better than autotuning.
   */
  public TransportOptions withTcpSocketBufferBytes(int bytes) {
    return new TransportOptions(
        tcpBindHost, tcpPort, tcpAdvertisedHost, tcpListen, bytes, ioTimeout, maxConnections,
        ioThreads, cmaInlineMaxBytes, tcpStagingBuffers, tcpStagingBufferBytes, ucxTransports,
        tcpStreams, cmaMapPeerPages, cmaCopyThreads);
  }

  /** A transfer (or a handshake) that makes no progress for this long fails. */
  public TransportOptions withIoTimeout(Duration timeout) {
    return new TransportOptions(
        tcpBindHost, tcpPort, tcpAdvertisedHost, tcpListen, tcpSocketBufferBytes, timeout,
        maxConnections, ioThreads, cmaInlineMaxBytes, tcpStagingBuffers, tcpStagingBufferBytes, ucxTransports,
        tcpStreams, cmaMapPeerPages, cmaCopyThreads);
  }

  /** Most connections the TCP listener serves at once; more are closed on accept. */
  public TransportOptions withMaxConnections(int connections) {
    return new TransportOptions(
        tcpBindHost, tcpPort, tcpAdvertisedHost, tcpListen, tcpSocketBufferBytes, ioTimeout,
        connections, ioThreads, cmaInlineMaxBytes, tcpStagingBuffers, tcpStagingBufferBytes, ucxTransports,
        tcpStreams, cmaMapPeerPages, cmaCopyThreads);
  }

  /** Threads that run transfers in the background (TCP batches, large CMA batches). */
  public TransportOptions withIoThreads(int threads) {
    return new TransportOptions(
        tcpBindHost, tcpPort, tcpAdvertisedHost, tcpListen, tcpSocketBufferBytes, ioTimeout,
        maxConnections, threads, cmaInlineMaxBytes, tcpStagingBuffers, tcpStagingBufferBytes, ucxTransports,
        tcpStreams, cmaMapPeerPages, cmaCopyThreads);
  }

  /** CMA batches up to this many bytes are copied in the caller's thread; larger ones in the background. */
  public TransportOptions withCmaInlineMaxBytes(long bytes) {
    return new TransportOptions(
        tcpBindHost, tcpPort, tcpAdvertisedHost, tcpListen, tcpSocketBufferBytes, ioTimeout,
        maxConnections, ioThreads, bytes, tcpStagingBuffers, tcpStagingBufferBytes, ucxTransports,
        tcpStreams, cmaMapPeerPages, cmaCopyThreads);
  }

  /**
   * How the tcp transport moves GPU memory: through {@code buffers} pinned host buffers of {@code
   * bufferBytes} each, per device and per transfer in flight on it. With 2 or more, device copies
   * of one buffer overlap the socket I/O of another; 1 serializes them (for comparison).
   */
  public TransportOptions withTcpStaging(int buffers, int bufferBytes) {
    return new TransportOptions(
        tcpBindHost, tcpPort, tcpAdvertisedHost, tcpListen, tcpSocketBufferBytes, ioTimeout,
        maxConnections, ioThreads, cmaInlineMaxBytes, buffers, bufferBytes, ucxTransports, tcpStreams,
        cmaMapPeerPages, cmaCopyThreads);
  }

  /**
   * The UCX transports the ucx transport may use, as UCX_TLS takes them ({@code tcp}, {@code sm},
   * {@code rc,sm,self}, ...); "" (the default) leaves UCX's choice: the environment's UCX_TLS,
   * else every transport UCX finds, verbs included where there is an RDMA device.
   */
  public TransportOptions withUcxTransports(String transports) {
    return new TransportOptions(
        tcpBindHost, tcpPort, tcpAdvertisedHost, tcpListen, tcpSocketBufferBytes, ioTimeout,
        maxConnections, ioThreads, cmaInlineMaxBytes, tcpStagingBuffers, tcpStagingBufferBytes,
        transports, tcpStreams, cmaMapPeerPages, cmaCopyThreads);
  }

  /**
   * Connections one tcp batch is striped over, in parallel on the io threads (at most {@link
   * #ioThreads} run at once): 1 (the default) sends a batch on one connection. Only batches of at
   * least {@link TcpTransport#MIN_STRIPE_BYTES} are striped.
   */
  public TransportOptions withTcpStreams(int streams) {
    return new TransportOptions(
        tcpBindHost, tcpPort, tcpAdvertisedHost, tcpListen, tcpSocketBufferBytes, ioTimeout,
        maxConnections, ioThreads, cmaInlineMaxBytes, tcpStagingBuffers, tcpStagingBufferBytes,
        ucxTransports, streams, cmaMapPeerPages, cmaCopyThreads);
  }

  public int tcpStreams() {
    return tcpStreams;
  }

  /**
   * Same options where the cma transport maps a peer's shared region pages and copies with
   * memcpy ({@code true}, the default), or always uses {@code process_vm_writev}/{@code readv}.
   */
  public TransportOptions withCmaMapPeerPages(boolean map) {
    return new TransportOptions(
        tcpBindHost, tcpPort, tcpAdvertisedHost, tcpListen, tcpSocketBufferBytes, ioTimeout,
        maxConnections, ioThreads, cmaInlineMaxBytes, tcpStagingBuffers, tcpStagingBufferBytes,
        ucxTransports, tcpStreams, map, cmaCopyThreads);
  }

  /**
   * Same options where a mapped cma copy of at least 4 MiB is shared by up to {@code threads} of
   * the I/O threads (the node raises its I/O threads to match); 1 copies each batch on one thread.
   */
  public TransportOptions withCmaCopyThreads(int threads) {
    return new TransportOptions(
        tcpBindHost, tcpPort, tcpAdvertisedHost, tcpListen, tcpSocketBufferBytes, ioTimeout,
        maxConnections, ioThreads, cmaInlineMaxBytes, tcpStagingBuffers, tcpStagingBufferBytes,
        ucxTransports, tcpStreams, cmaMapPeerPages, threads);
  }

  /** Threads a large mapped cma copy is shared by, at most (see {@link #withCmaCopyThreads}). */
  public int cmaCopyThreads() {
    return cmaCopyThreads;
  }

  /** Whether cma copies through mappings of peers' shared pages where they have them. */
  public boolean cmaMapPeerPages() {
    return cmaMapPeerPages;
  }

  /** UCX_TLS for the ucx transport, or "" for UCX's own choice. */
  public String ucxTransports() {
    return ucxTransports;
  }

  public String tcpBindHost() {
    return tcpBindHost;
  }

  public int tcpPort() {
    return tcpPort;
  }

  /** The advertised host, or "" to advertise the bind host. */
  public String tcpAdvertisedHost() {
    return tcpAdvertisedHost;
  }

  public boolean tcpListen() {
    return tcpListen;
  }

  public int tcpSocketBufferBytes() {
    return tcpSocketBufferBytes;
  }

  public Duration ioTimeout() {
    return ioTimeout;
  }

  public int maxConnections() {
    return maxConnections;
  }

  public int ioThreads() {
    return ioThreads;
  }

  public long cmaInlineMaxBytes() {
    return cmaInlineMaxBytes;
  }

  public int tcpStagingBuffers() {
    return tcpStagingBuffers;
  }

  public int tcpStagingBufferBytes() {
    return tcpStagingBufferBytes;
  }

  @Override
  public String toString() {
    return "TransportOptions[tcp=" + tcpBindHost + ":" + tcpPort
        + (tcpAdvertisedHost.isEmpty() ? "" : " as " + tcpAdvertisedHost)
        + (tcpListen ? "" : " (no listener)") + ", socketBuffer=" + tcpSocketBufferBytes
        + ", ioTimeout=" + ioTimeout + ", maxConnections=" + maxConnections + ", ioThreads="
        + ioThreads + ", cmaInlineMaxBytes=" + cmaInlineMaxBytes + ", tcpStaging="
        + tcpStagingBuffers + "x" + tcpStagingBufferBytes
        + (tcpStreams == 1 ? "" : ", tcpStreams=" + tcpStreams)
        + (cmaMapPeerPages ? "" : ", cma without mapped peer pages")
        + (cmaCopyThreads == 2 ? "" : ", cmaCopyThreads=" + cmaCopyThreads)
        + (ucxTransports.isEmpty() ? "" : ", ucxTransports=" + ucxTransports) + "]";
  }
}
