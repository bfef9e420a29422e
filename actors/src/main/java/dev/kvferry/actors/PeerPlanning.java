package dev.kvferry.actors;

import dev.kvferry.actors.engine.AgentMetadata;
import dev.kvferry.actors.engine.EngineDirectory;
import dev.kvferry.actors.engine.EngineIdentity;
import dev.kvferry.actors.plan.HeadSlice;
import dev.kvferry.actors.plan.InvalidBlockIdsException;
import dev.kvferry.actors.plan.KvCacheGeometry;
import dev.kvferry.actors.plan.TensorParallelSplit;
import dev.kvferry.actors.plan.TransferPlanner;
import dev.kvferry.rdma.TransferBatch;
import java.util.Arrays;
import java.util.List;
import java.util.OptionalInt;

/** The plan between this worker and one worker of the other side, whatever their shapes. */
final class PeerPlanning {

  private PeerPlanning() {}

  /**
   * Plans one layer's copies between this worker and {@code peer}. Same layout, block size and
   * heads (equal TP sizes, or MLA): the block plan, exactly as before. Otherwise (also a standard
   * cache on one side and a blocks-first one on the other) the token-range plan of the heads both
   * hold.
   *
   * <p>A prefix-cache hit on D leaves D fewer blocks than P: with equal block sizes P's list is cut
   * to its tail, as the seed does; with different block sizes the planner refuses it.
   *
   * @param localIsDecode whether this worker is D (D's list may be the shorter one)
   */
  static TransferBatch plan(
      TransferPlanner planner,
      KvCacheGeometry local,
      int localTpRank,
      int localTpSize,
      AgentMetadata peer,
      int[] localBlockIds,
      int[] remoteBlockIds,
      boolean localIsDecode)
      throws InvalidBlockIdsException {
    KvCacheGeometry remote = peer.geometry();
    boolean mla = local.layout() == KvCacheGeometry.Layout.MLA;
    boolean sameHeads = mla || localTpSize == peer.tpSize();
    int[] l = localBlockIds;
    int[] r = remoteBlockIds;
    if (local.blockSize() == remote.blockSize()) {
      int[] decode = localIsDecode ? l : r;
      int[] prefill = localIsDecode ? r : l;
      if (decode.length > prefill.length) {
        throw new InvalidBlockIdsException(
            localIsDecode
                ? "decode has " + decode.length + " blocks to fill but prefill sent only "
                    + prefill.length
                : "decode sent " + decode.length + " blocks but prefill has only "
                    + prefill.length);
      }
      if (decode.length < prefill.length) {
        prefill = Arrays.copyOfRange(prefill, prefill.length - decode.length, prefill.length);
      }
      l = localIsDecode ? decode : prefill;
      r = localIsDecode ? prefill : decode;
      if (sameHeads && local.layout() == remote.layout()) {
        return planner.plan(local, remote.numBlocks(), l, r);
      }
    }
    HeadSlice heads =
        mla
            ? null
            : TensorParallelSplit.slice(
                localTpRank, localTpSize, peer.tpRank(), peer.tpSize(),
                Math.multiplyExact(local.kvHeads(), localTpSize));
    return planner.planTokenRanges(local, remote, heads, l, r);
  }

  /** D: the P workers a D worker receives from (reads from or is written by), given P's TP size. */
  static int[] sourcesFor(EngineIdentity self, int prefillTpSize, boolean mla) {
    return prefillTpSize == self.tpSize()
        ? new int[] {self.tpRank()}
        : TensorParallelSplit.sourcesOf(self.tpRank(), self.tpSize(), prefillTpSize, mla);
  }

  /**
   * P: the D workers a P worker's heads go to, given D's TP size; unknown (empty): the worker of
   * our rank.
   */
  static int[] targetsFor(EngineIdentity self, OptionalInt decodeTpSize, boolean mla) {
    return decodeTpSize.isEmpty() || decodeTpSize.getAsInt() == self.tpSize()
        ? new int[] {self.tpRank()}
        : TensorParallelSplit.targetsOf(self.tpRank(), self.tpSize(), decodeTpSize.getAsInt(), mla);
  }

  /** The TP size of an engine as its listed workers say, if any is listed. */
  static OptionalInt tpSizeOf(EngineDirectory directory, String engineId) {
    List<EngineDirectory.Entry> ranks = directory.ranksOf(engineId);
    return ranks.isEmpty()
        ? OptionalInt.empty()
        : OptionalInt.of(ranks.get(0).identity().tpSize());
  }
}
