package dev.kvferry.node;

import com.typesafe.config.Config;
import dev.kvferry.actors.connector.Role;
import dev.kvferry.actors.connector.TransferMode;
import dev.kvferry.actors.engine.ConnectorSettings;
import dev.kvferry.actors.plan.KvCacheGeometry;
import dev.kvferry.rdma.TransportOptions;
import java.util.List;

/** The {@code kvferry.*} section of the config, read once and checked, as typed values. */
public record NodeSettings(
    Role role,
    String engineId,
    int dpRank,
    int dpSize,
    int tpSize,
    List<TransferMode> modes,
    String transport,
    TransportOptions transportOptions,
    int gpu,
    KvCacheGeometry geometry,
    int layers,
    String engine,
    ConnectorSettings connector) {

  /** Reads and checks {@code kvferry.node} and {@code kvferry.connector}. */
  public static NodeSettings fromConfig(Config root) {
    Config n = root.getConfig("kvferry.node");
    Role role = Role.parse(n.getString("role"));
    int dpRank = n.getInt("dp-rank");
    String engineId = n.getString("engine-id");
    if (engineId.isBlank()) {
      engineId =
          role.clusterRole() + "-" + root.getString("pekko.remote.artery.canonical.hostname") + "-"
              + root.getInt("pekko.remote.artery.canonical.port") + "-dp" + dpRank;
    }
    Config kv = n.getConfig("kv-cache");
    if (kv.getBoolean("mla") && kv.getBoolean("blocks-first")) {
      throw new IllegalArgumentException(
          "kvferry.node.kv-cache: mla and blocks-first are two layouts; set at most one");
    }
    KvCacheGeometry geometry =
        kv.getBoolean("mla")
            ? KvCacheGeometry.mla(
                kv.getInt("num-blocks"), kv.getInt("block-size"), kv.getInt("latent"),
                kv.getInt("dtype-bytes"))
            : kv.getBoolean("blocks-first")
                ? KvCacheGeometry.blocksFirst(
                    kv.getInt("num-blocks"), kv.getInt("block-size"), kv.getInt("kv-heads"),
                    kv.getInt("head-dim"), kv.getInt("dtype-bytes"))
                : KvCacheGeometry.standard(
                    kv.getInt("num-blocks"), kv.getInt("block-size"), kv.getInt("kv-heads"),
                    kv.getInt("head-dim"), kv.getInt("dtype-bytes"));
    int layers = kv.getInt("layers");
    if (layers < 1) {
      throw new IllegalArgumentException("kvferry.node.kv-cache.layers must be >= 1, got " + layers);
    }
    String transport = n.getString("transport");
    int gpu = n.getInt("gpu");
    checkGpu(gpu, transport);
    Config tcp = n.getConfig("tcp");
    TransportOptions options =
        TransportOptions.defaults()
            .withTcpBind(tcp.getString("bind-host"), tcp.getInt("port"))
            .withTcpAdvertisedHost(tcp.getString("advertised-host"))
            .withTcpStaging(tcp.getInt("staging-buffers"),
                (int) Math.min(Integer.MAX_VALUE, tcp.getBytes("staging-buffer-bytes")))
            .withUcxTransports(n.getString("ucx.transports"))
            .withCmaMapPeerPages(n.getBoolean("cma.map-peer-pages"));
    int streams = tcp.getInt("streams");
    if (streams < 1 || streams > TransportOptions.MAX_TCP_STREAMS) {
      throw new IllegalArgumentException("kvferry.node.tcp.streams must be in [1, "
          + TransportOptions.MAX_TCP_STREAMS + "], got " + streams);
    }
    int copyThreads = n.getInt("cma.copy-threads");
    if (copyThreads < 1 || copyThreads > TransportOptions.MAX_CMA_COPY_THREADS) {
      throw new IllegalArgumentException("kvferry.node.cma.copy-threads must be in [1, "
          + TransportOptions.MAX_CMA_COPY_THREADS + "], got " + copyThreads);
    }
    options = options.withTcpStreams(streams)
        .withCmaCopyThreads(copyThreads)
        .withIoThreads(Math.max(options.ioThreads(), Math.max(streams, copyThreads)));
    return new NodeSettings(
        role,
        engineId,
        dpRank,
        n.getInt("dp-size"),
        n.getInt("tp-size"),
        parseModes(n.getString("mode")),
        transport,
        options,
        gpu,
        geometry,
        layers,
        n.getString("engine"),
        connectorSettings(root));
  }

  /**
   * A KV cache on a GPU is moved by the cuda transport (CUDA IPC, same host) or by tcp (staged
   * through pinned host buffers, any host); the cuda transport moves only GPU memory.
   */
  static void checkGpu(int gpu, String transport) {
    if (gpu < -1) {
      throw new IllegalArgumentException(
          "kvferry.node.gpu must be a CUDA device id, or -1 for host memory; got " + gpu);
    }
    if (gpu >= 0 && !transport.equals("cuda") && !transport.equals("tcp")) {
      throw new IllegalArgumentException("kvferry.node.gpu = " + gpu + " puts the KV cache on GPU "
          + gpu + ", which the cuda transport (same host) or tcp (any host) moves; set"
          + " kvferry.node.transport = \"cuda\" or \"tcp\", not \"" + transport + "\"");
    }
    if (gpu < 0 && transport.equals("cuda")) {
      throw new IllegalArgumentException("the cuda transport moves GPU memory: give the node a GPU"
          + " with kvferry.node.gpu (--gpu N), or pick cma or tcp for a KV cache in host memory");
    }
  }

  /** Whether the KV cache lives on a GPU ({@link #gpu()}) rather than in host memory. */
  public boolean onGpu() {
    return gpu >= 0;
  }

  /** "write", "read" or both ("write,read"): a node may host one engine per mode. */
  static List<TransferMode> parseModes(String s) {
    List<TransferMode> modes = new java.util.ArrayList<>();
    for (String part : s.split(",")) {
      TransferMode m = TransferMode.parse(part.trim());
      if (!modes.contains(m)) {
        modes.add(m);
      }
    }
    return List.copyOf(modes);
  }

  /** The engine id of this node's engine for {@code mode}: suffixed when the node hosts both. */
  public String engineIdFor(TransferMode mode) {
    return modes.size() == 1 ? engineId : engineId + "-" + mode.configName();
  }

  public static ConnectorSettings connectorSettings(Config root) {
    Config c = root.getConfig("kvferry.connector");
    return new ConnectorSettings(
        c.getDuration("handshake-timeout"),
        c.getInt("handshake-attempts"),
        c.getDuration("handshake-backoff"),
        c.getDuration("defer-timeout"),
        c.getDuration("transfer-timeout"),
        c.getDuration("read-abort-timeout"),
        c.getInt("terminal-id-capacity"),
        c.getBoolean("reads-at-admission"),
        c.getDuration("reattach-grace"));
  }
}
