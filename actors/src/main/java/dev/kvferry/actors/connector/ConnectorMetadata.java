package dev.kvferry.actors.connector;

import java.util.List;

/**
 * Per-step metadata from the scheduler to the workers.
 *
 * @param reqsToSave P, WRITE mode: requests whose final chunk runs this step; their layers are
 *     written as they are computed
 * @param reqsToRecv D, READ mode: requests to read from P (an empty block list only tells P to free)
 * @param reqsToSend P, READ mode: finished requests whose blocks stay until D releases them
 */
public record ConnectorMetadata(
    List<ReqMeta> reqsToSave, List<ReqMeta> reqsToRecv, List<PendingSend> reqsToSend) {

  public static final ConnectorMetadata EMPTY =
      new ConnectorMetadata(List.of(), List.of(), List.of());

  public ConnectorMetadata {
    reqsToSave = List.copyOf(reqsToSave);
    reqsToRecv = List.copyOf(reqsToRecv);
    reqsToSend = List.copyOf(reqsToSend);
  }

  /**
   * P, READ mode: a request whose blocks wait for D to read them.
   *
   * @param deadlineEpochMs after this P frees the blocks even if D never came (the seed's abort
   *     timeout)
   * @param consumerEngineId the decode engine expected to read, or "" when unknown
   */
  public record PendingSend(
      String requestId, String transferId, long deadlineEpochMs, String consumerEngineId) {}

  public boolean isEmpty() {
    return reqsToSave.isEmpty() && reqsToRecv.isEmpty() && reqsToSend.isEmpty();
  }
}
