package dev.kvferry.actors.plan;

/**
 * Which TP ranks of the other side a worker exchanges KV with when P and D run different TP sizes.
 *
 * <p>Standard layout: the KV heads are split evenly, rank {@code r} of {@code T} holding heads
 * {@code [r*H/T, (r+1)*H/T)}; a D rank exchanges with every P rank whose heads overlap its own,
 * and moves exactly the overlapping heads. MLA: the latent is replicated on every rank, so each D
 * rank has one source, P rank {@code s % tpP}; P ranks beyond D's size have nobody to send to.
 *
 * <p>With equal TP sizes every rank pairs with the rank of the same number, as before.
 */
public final class TensorParallelSplit {

  private TensorParallelSplit() {}

  /** The P ranks D rank {@code decodeRank} (of {@code decodeTp}) receives from, in rank order. */
  public static int[] sourcesOf(int decodeRank, int decodeTp, int prefillTp, boolean mla) {
    if (mla) {
      return new int[] {decodeRank % prefillTp};
    }
    return overlapping(decodeRank, decodeTp, prefillTp);
  }

  /** The D ranks P rank {@code prefillRank} (of {@code prefillTp}) sends to, in rank order. */
  public static int[] targetsOf(int prefillRank, int prefillTp, int decodeTp, boolean mla) {
    if (mla) {
      int count = 0;
      for (int s = prefillRank; s < decodeTp; s += prefillTp) {
        count++;
      }
      int[] out = new int[count];
      for (int i = 0, s = prefillRank; s < decodeTp; s += prefillTp, i++) {
        out[i] = s;
      }
      return out;
    }
    return overlapping(prefillRank, prefillTp, decodeTp);
  }

  /**
   * Ranks of a {@code peerTp} group whose share of the heads overlaps rank {@code rank} of a
   * {@code tp} group: share {@code [rank/tp, (rank+1)/tp)} against {@code [p/peerTp, (p+1)/peerTp)}.
   */
  private static int[] overlapping(int rank, int tp, int peerTp) {
    int first = (int) ((long) rank * peerTp / tp);
    int last = (int) (((long) (rank + 1) * peerTp + tp - 1) / tp) - 1; // ceil - 1
    int[] out = new int[last - first + 1];
    for (int i = 0; i < out.length; i++) {
      out[i] = first + i;
    }
    return out;
  }

  /** First head of rank {@code rank} of {@code tp} when {@code totalHeads} are split evenly. */
  public static int firstHead(int rank, int tp, int totalHeads) {
    return rank * (totalHeads / tp);
  }

  /**
   * The heads two ranks both hold, as positions within each rank's own heads.
   *
   * @param localRank rank here, of {@code localTp}
   * @param remoteRank rank on the other side, of {@code remoteTp}
   * @param totalHeads KV heads of the model, divisible by both TP sizes
   */
  public static HeadSlice slice(
      int localRank, int localTp, int remoteRank, int remoteTp, int totalHeads) {
    if (totalHeads % localTp != 0 || totalHeads % remoteTp != 0) {
      throw new IllegalArgumentException(
          totalHeads + " KV heads cannot be split evenly over TP sizes " + localTp + " and "
              + remoteTp);
    }
    int localFirst = firstHead(localRank, localTp, totalHeads);
    int remoteFirst = firstHead(remoteRank, remoteTp, totalHeads);
    int first = Math.max(localFirst, remoteFirst);
    int end =
        Math.min(localFirst + totalHeads / localTp, remoteFirst + totalHeads / remoteTp);
    if (end <= first) {
      throw new IllegalArgumentException(
          "rank " + localRank + "/" + localTp + " and rank " + remoteRank + "/" + remoteTp
              + " share no KV heads");
    }
    return new HeadSlice(first - localFirst, first - remoteFirst, end - first);
  }
}
