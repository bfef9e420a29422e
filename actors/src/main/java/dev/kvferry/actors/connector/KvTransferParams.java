package dev.kvferry.actors.connector;

import java.util.Arrays;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import org.jspecify.annotations.Nullable;

/**
 * The kv_transfer_params a request carries between P and D, as in the seed, with kvferry's
 * additions: a transfer id shared by the P/D pair of a request, and engine ids that name cluster
 * members instead of host/port pairs.
 *
 * @param doRemotePrefill D side: the KV comes from a remote prefill
 * @param doRemoteDecode P side: the KV goes to a remote decode
 * @param transferId shared by P and D for this request's transfer
 * @param remoteEngineId the engine on the other side
 * @param remoteDpRank DP rank of the engine on the other side
 * @param remoteBlockIds READ mode: P's block ids that D reads
 * @param remoteHost seed compatibility: host of the other side
 * @param remotePort seed compatibility: handshake port of the other side
 * @param tpSize TP size of the side that wrote these params
 * @param remoteWorkerUids READ mode, from P: by TP rank, the actor uid of the P worker incarnation
 *     that holds the blocks (kvferry's addition, key {@code remote_worker_uids}). D reads only from
 *     that incarnation: an engine that attached again under the same id has other memory, and the
 *     old incarnation can stay listed for a moment after it stopped. Empty: any (older senders).
 */
public record KvTransferParams(
    boolean doRemotePrefill,
    boolean doRemoteDecode,
    String transferId,
    String remoteEngineId,
    int remoteDpRank,
    int[] remoteBlockIds,
    String remoteHost,
    int remotePort,
    int tpSize,
    int[] remoteWorkerUids) {

  public KvTransferParams {
    remoteBlockIds = remoteBlockIds == null ? new int[0] : remoteBlockIds;
    remoteHost = remoteHost == null ? "" : remoteHost;
    remoteWorkerUids = remoteWorkerUids == null ? new int[0] : remoteWorkerUids;
  }

  /** Without worker uids (any incarnation of the remote workers). */
  public KvTransferParams(boolean doRemotePrefill, boolean doRemoteDecode, String transferId,
      String remoteEngineId, int remoteDpRank, int[] remoteBlockIds, String remoteHost,
      int remotePort, int tpSize) {
    this(doRemotePrefill, doRemoteDecode, transferId, remoteEngineId, remoteDpRank,
        remoteBlockIds, remoteHost, remotePort, tpSize, new int[0]);
  }

  /**
   * The uid of the remote worker of TP rank {@code rank} these params name, or 0 (Pekko's
   * "undefined" uid) when they name none: any incarnation will do.
   */
  public int remoteWorkerUid(int rank) {
    return rank >= 0 && rank < remoteWorkerUids.length ? remoteWorkerUids[rank] : 0;
  }

  /** Params for a request that D receives from P (the router hands these to D). */
  public static KvTransferParams forDecode(String transferId, String prefillEngineId, int prefillDp) {
    return new KvTransferParams(true, false, transferId, prefillEngineId, prefillDp, new int[0], "", 0, 1);
  }

  /** Params for a request that P prefills for D (the router hands these to P). */
  public static KvTransferParams forPrefill(String transferId, String decodeEngineId, int decodeDp) {
    return new KvTransferParams(false, true, transferId, decodeEngineId, decodeDp, new int[0], "", 0, 1);
  }

  public KvTransferParams withDoRemotePrefill(boolean value) {
    return new KvTransferParams(
        value, doRemoteDecode, transferId, remoteEngineId, remoteDpRank, remoteBlockIds,
        remoteHost, remotePort, tpSize, remoteWorkerUids);
  }

  /**
   * Reads params from the loosely typed map an engine passes around (JSON-like values).
   *
   * @throws InvalidTransferParamsException naming the field when one is missing or mistyped
   */
  public static KvTransferParams fromMap(Map<String, ?> map) throws InvalidTransferParamsException {
    if (map == null) {
      throw new InvalidTransferParamsException("kv_transfer_params is null");
    }
    boolean prefill = bool(map, "do_remote_prefill");
    boolean decode = bool(map, "do_remote_decode");
    if (prefill && decode) {
      throw new InvalidTransferParamsException(
          "kv_transfer_params sets both do_remote_prefill and do_remote_decode");
    }
    String transferId = string(map, "transfer_id", !(prefill || decode));
    String engine = string(map, "remote_engine_id", !(prefill || decode));
    int dp = integer(map, "remote_dp_rank", 0);
    int[] blocks = integers(map.get("remote_block_ids"), "remote_block_ids", 0);
    int[] uids = integers(map.get("remote_worker_uids"), "remote_worker_uids",
        Integer.MIN_VALUE);
    String host = string(map, "remote_host", true);
    int port = integer(map, "remote_port", 0);
    int tp = integer(map, "tp_size", 1);
    if (dp < 0 || tp < 1 || port < 0 || port > 65535) {
      throw new InvalidTransferParamsException(
          "kv_transfer_params out of range: remote_dp_rank=" + dp + " tp_size=" + tp
              + " remote_port=" + port);
    }
    return new KvTransferParams(
        prefill, decode, transferId, engine, dp, blocks, host, port, tp, uids);
  }

  /** The map form, with the seed's field names. */
  public Map<String, Object> toMap() {
    Map<String, Object> m = new LinkedHashMap<>();
    m.put("do_remote_prefill", doRemotePrefill);
    m.put("do_remote_decode", doRemoteDecode);
    m.put("transfer_id", transferId);
    m.put("remote_engine_id", remoteEngineId);
    m.put("remote_dp_rank", remoteDpRank);
    m.put("remote_block_ids", Arrays.stream(remoteBlockIds).boxed().toList());
    m.put("remote_host", remoteHost);
    m.put("remote_port", remotePort);
    m.put("tp_size", tpSize);
    if (remoteWorkerUids.length > 0) {
      m.put("remote_worker_uids", Arrays.stream(remoteWorkerUids).boxed().toList());
    }
    return m;
  }

  private static boolean bool(Map<String, ?> m, String key) throws InvalidTransferParamsException {
    Object v = m.get(key);
    if (v == null) {
      return false;
    }
    if (v instanceof Boolean b) {
      return b;
    }
    throw new InvalidTransferParamsException(
        "kv_transfer_params." + key + " must be a boolean, got " + describe(v));
  }

  private static String string(Map<String, ?> m, String key, boolean optional)
      throws InvalidTransferParamsException {
    Object v = m.get(key);
    if (v == null) {
      if (optional) {
        return "";
      }
      throw new InvalidTransferParamsException("kv_transfer_params." + key + " is missing");
    }
    if (v instanceof String s) {
      if (!optional && s.isBlank()) {
        throw new InvalidTransferParamsException("kv_transfer_params." + key + " is empty");
      }
      return s;
    }
    throw new InvalidTransferParamsException(
        "kv_transfer_params." + key + " must be a string, got " + describe(v));
  }

  private static int integer(Map<String, ?> m, String key, int dflt)
      throws InvalidTransferParamsException {
    Object v = m.get(key);
    if (v == null) {
      return dflt;
    }
    if (v instanceof Integer || v instanceof Long || v instanceof Short) {
      long l = ((Number) v).longValue();
      if (l >= Integer.MIN_VALUE && l <= Integer.MAX_VALUE) {
        return (int) l;
      }
    }
    throw new InvalidTransferParamsException(
        "kv_transfer_params." + key + " must be an integer, got " + describe(v));
  }

  /** A list of ints, each at least {@code min}; absent: empty. */
  private static int[] integers(@Nullable Object v, String key, int min)
      throws InvalidTransferParamsException {
    if (v == null) {
      return new int[0];
    }
    if (v instanceof int[] a) {
      return a.clone();
    }
    if (v instanceof List<?> list) {
      int[] out = new int[list.size()];
      for (int i = 0; i < out.length; i++) {
        Object e = list.get(i);
        if (!(e instanceof Integer || e instanceof Long || e instanceof Short)
            || ((Number) e).longValue() < min
            || ((Number) e).longValue() > Integer.MAX_VALUE) {
          throw new InvalidTransferParamsException("kv_transfer_params." + key + "[" + i
              + "] must be " + (min == 0 ? "a non-negative" : "a 32-bit") + " integer, got "
              + describe(e));
        }
        out[i] = ((Number) e).intValue();
      }
      return out;
    }
    throw new InvalidTransferParamsException(
        "kv_transfer_params." + key + " must be a list of integers, got " + describe(v));
  }

  private static String describe(Object v) {
    return v == null ? "null" : v.getClass().getSimpleName() + " " + v;
  }

  @Override
  public boolean equals(Object o) {
    return o instanceof KvTransferParams p
        && doRemotePrefill == p.doRemotePrefill
        && doRemoteDecode == p.doRemoteDecode
        && java.util.Objects.equals(transferId, p.transferId)
        && java.util.Objects.equals(remoteEngineId, p.remoteEngineId)
        && remoteDpRank == p.remoteDpRank
        && Arrays.equals(remoteBlockIds, p.remoteBlockIds)
        && remoteHost.equals(p.remoteHost)
        && remotePort == p.remotePort
        && tpSize == p.tpSize
        && Arrays.equals(remoteWorkerUids, p.remoteWorkerUids);
  }

  @Override
  public int hashCode() {
    return java.util.Objects.hash(transferId, remoteEngineId, doRemotePrefill, doRemoteDecode);
  }

  @Override
  public String toString() {
    return "KvTransferParams[transfer=" + transferId + ", remote=" + remoteEngineId + "/dp"
        + remoteDpRank + (doRemotePrefill ? ", remote-prefill" : "")
        + (doRemoteDecode ? ", remote-decode" : "") + ", blocks=" + remoteBlockIds.length + "]";
  }
}
