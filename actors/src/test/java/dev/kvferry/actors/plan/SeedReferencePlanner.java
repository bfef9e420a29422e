package dev.kvferry.actors.plan;

import dev.kvferry.rdma.TransferBatch;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.List;

/**
 * The seed's planner written the plain way, for tests: one K (and V) copy per block from the raw
 * tensor strides, a stable sort by local offset, then a naive merge. No validation, no shortcuts.
 */
final class SeedReferencePlanner {

  private SeedReferencePlanner() {}

  static TransferBatch plan(
      KvCacheGeometry g, int remoteNumBlocks, int[] localBlockIds, int[] remoteBlockIds) {
    boolean mla = g.layout() == KvCacheGeometry.Layout.MLA;
    long sz = g.elementBytes();
    long heads = mla ? 1 : g.kvHeads();
    long headSize = mla ? g.latent() : g.headDim();
    long blockStride = g.blockSize() * heads * headSize; // elements
    long localKToV = g.numBlocks() * blockStride;
    long remoteKToV = remoteNumBlocks * blockStride;
    long transferBytes = g.blockSize() * heads * headSize * sz;

    List<long[]> copies = new ArrayList<>(); // {local, remote, size}
    for (int i = 0; i < localBlockIds.length; i++) {
      long lb = localBlockIds[i];
      long rb = remoteBlockIds[i];
      copies.add(new long[] {sz * lb * blockStride, sz * rb * blockStride, transferBytes});
      if (!mla) {
        copies.add(
            new long[] {
              sz * (localKToV + lb * blockStride),
              sz * (remoteKToV + rb * blockStride),
              transferBytes
            });
      }
    }
    boolean sorted = true;
    for (int i = 1; i < copies.size(); i++) {
      sorted &= copies.get(i - 1)[0] <= copies.get(i)[0];
    }
    if (!sorted) {
      copies.sort(Comparator.comparingLong(c -> c[0])); // List.sort is stable
    }

    List<long[]> merged = new ArrayList<>();
    long[] first = null;
    long[] last = null;
    for (long[] c : copies) {
      if (last != null && c[0] - last[0] == last[2] && c[1] - last[1] == last[2]) {
        last = c;
        continue;
      }
      if (first != null) {
        merged.add(new long[] {first[0], first[1], last[0] + last[2] - first[0]});
      }
      first = c;
      last = c;
    }
    if (first != null) {
      merged.add(new long[] {first[0], first[1], last[0] + last[2] - first[0]});
    }
    long[] lo = new long[merged.size()];
    long[] ro = new long[merged.size()];
    long[] so = new long[merged.size()];
    for (int i = 0; i < merged.size(); i++) {
      lo[i] = merged.get(i)[0];
      ro[i] = merged.get(i)[1];
      so[i] = merged.get(i)[2];
    }
    return new TransferBatch(lo, ro, so);
  }
}
