package dev.kvferry.actors.connector;


/**
 * One request's transfer, as the scheduler hands it to the workers in a step's metadata.
 *
 * @param requestId the engine's request id
 * @param transferId shared by P and D for this request
 * @param localBlockIds this engine's blocks of the request
 * @param remoteBlockIds READ mode: the peer's blocks to read (same length as localBlockIds)
 * @param remoteEngineId the engine on the other side
 * @param remoteDpRank its DP rank
 * @param remoteWorkerUids READ mode on D: by P's TP rank, the P worker incarnation to read from
 *     ({@link KvTransferParams#remoteWorkerUids}); empty: whichever is listed
 */
public record ReqMeta(
    String requestId,
    String transferId,
    int[] localBlockIds,
    int[] remoteBlockIds,
    String remoteEngineId,
    int remoteDpRank,
    int[] remoteWorkerUids) {

  public ReqMeta {
    localBlockIds = localBlockIds == null ? new int[0] : localBlockIds;
    remoteBlockIds = remoteBlockIds == null ? new int[0] : remoteBlockIds;
    remoteWorkerUids = remoteWorkerUids == null ? new int[0] : remoteWorkerUids;
  }

  /** Without worker uids: whichever incarnation is listed. */
  public ReqMeta(String requestId, String transferId, int[] localBlockIds, int[] remoteBlockIds,
      String remoteEngineId, int remoteDpRank) {
    this(requestId, transferId, localBlockIds, remoteBlockIds, remoteEngineId, remoteDpRank,
        new int[0]);
  }

  /** The uid of P's worker of TP rank {@code rank} to read from; 0: whichever is listed. */
  public int remoteWorkerUid(int rank) {
    return rank >= 0 && rank < remoteWorkerUids.length ? remoteWorkerUids[rank] : 0;
  }
}
