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
 */
public record ReqMeta(
    String requestId,
    String transferId,
    int[] localBlockIds,
    int[] remoteBlockIds,
    String remoteEngineId,
    int remoteDpRank) {

  public ReqMeta {
    localBlockIds = localBlockIds == null ? new int[0] : localBlockIds;
    remoteBlockIds = remoteBlockIds == null ? new int[0] : remoteBlockIds;
  }
}
