package dev.kvferry.actors.plan;

import dev.kvferry.rdma.TransferBatch;
import java.util.Arrays;
import java.util.HashMap;
import java.util.Map;
import java.util.Objects;
import org.jspecify.annotations.Nullable;

/**
 * Turns the block ids of a request into the copies that move its KV cache: one entry per run of
 * blocks that is contiguous on both sides, in local offset order.
 *
 * <p>Same output as the seed's {@code _compute_block_transfer_offsets} followed by {@code
 * merge_contiguous_blocks}: each block gives a K copy and, for the standard layout, a V copy (a
 * blocks-first block is one copy of its K and V); the
 * remote V offset uses the remote K-to-V stride ({@code blockStride * remoteNumBlocks}); copies are
 * ordered by local offset (a stable sort) and a run merges while both local and remote offsets
 * advance by exactly one block. Unlike the seed it rejects ids it would silently turn into writes
 * outside the cache or into overlapping copies.
 *
 * <p>Planning allocates only the output arrays once the scratch buffers have grown to the largest
 * cache seen. <b>Not thread-safe</b>: each actor (or thread) owns its planner.
 */
public final class TransferPlanner {

  /** An unsorted request spanning more than this many bitmap words per id is sorted instead. */
  private static final int MAX_WORDS_PER_ID_FOR_BITMAP = 4;

  /**
   * Remote ids spanning more than this many words (4M ids, a 512 KiB bitmap) are checked for
   * repeats by sorting, so a peer claiming a huge cache cannot make the planner allocate for it.
   */
  private static final int MAX_REMOTE_BITMAP_WORDS = 1 << 16;

  /**
   * Remote ids spanning at most this many ids (a 256 KiB table) are checked for repeats with
   * {@link #remoteStamps}: each id is a load and a store of its own slot, where setting bits in a
   * bitmap chains every id through the few words they share (a store, then the next id's load
   * of the same word).
   */
  private static final int MAX_REMOTE_STAMP_SPAN = 1 << 16;

  /**
   * Plans of at most this many copies are merged in one pass into scratch arrays (3 x 32 KiB) and
   * copied out; larger ones count first and write into their own arrays, as a second pass through
   * memory costs more than the count there.
   */
  private static final int MAX_SCRATCH_COPIES = 4096;

  // Invariant between calls: every bit of both bitmaps is clear.
  private long[] localIdBits = new long[0];
  private long[] remoteIdBits = new long[0];
  private int[] remoteIdByLocalId = new int[0];
  private int[] sortedLocalIds = new int[0];
  private int[] sortedRemoteIds = new int[0];
  private long[] packedIds = new long[0];
  private int[] remoteIdsCopy = new int[0];
  // Slot r - minRemote holds the call's stamp once id r was seen in that call; older calls'
  // stamps are other numbers, so nothing is cleared between calls. 0 is never a stamp.
  private int[] remoteStamps = new int[0];
  private int stamp;
  private long[] scratchLocalOffsets = new long[0];
  private long[] scratchRemoteOffsets = new long[0];
  private long[] scratchSizes = new long[0];

  /**
   * Plans the copies of one layer; all layers of one geometry share the plan.
   *
   * @param local this engine's cache geometry
   * @param remoteNumBlocks blocks in the remote engine's cache (it sets the remote V offsets)
   * @param localBlockIds blocks of the request here, in request order
   * @param remoteBlockIds the matching blocks on the remote engine, same order
   * @return offsets relative to each side's layer tensor, and sizes, all in bytes
   * @throws InvalidBlockIdsException if the lists differ in length, or hold an id that is negative,
   *     out of range for its side, or repeated within its list
   */
  public TransferBatch plan(
      KvCacheGeometry local, int remoteNumBlocks, int[] localBlockIds, int[] remoteBlockIds)
      throws InvalidBlockIdsException {
    Objects.requireNonNull(local, "local");
    Objects.requireNonNull(localBlockIds, "localBlockIds");
    Objects.requireNonNull(remoteBlockIds, "remoteBlockIds");
    requireRemoteFits(local, remoteNumBlocks);
    int n = localBlockIds.length;
    if (n != remoteBlockIds.length) {
      throw lengthMismatch(localBlockIds, remoteBlockIds);
    }
    if (n == 0) {
      return TransferBatch.EMPTY;
    }
    int localNumBlocks = local.numBlocks();

    // Pass 1: ranges, and whether local ids already strictly increase (the fast path).
    boolean increasing = true;
    int previous = -1;
    int minLocal = Integer.MAX_VALUE;
    int maxLocal = 0;
    int minRemote = Integer.MAX_VALUE;
    int maxRemote = 0;
    for (int i = 0; i < n; i++) {
      int l = localBlockIds[i];
      int r = remoteBlockIds[i];
      if (l < 0 || l >= localNumBlocks || r < 0 || r >= remoteNumBlocks) {
        throw firstProblem(localNumBlocks, remoteNumBlocks, localBlockIds, remoteBlockIds);
      }
      increasing &= l > previous;
      previous = l;
      minLocal = Math.min(minLocal, l);
      maxLocal = Math.max(maxLocal, l);
      minRemote = Math.min(minRemote, r);
      maxRemote = Math.max(maxRemote, r);
    }

    // Pass 2: no remote id twice (strictly increasing local ids cannot repeat).
    long remoteSpan = (long) maxRemote - minRemote + 1;
    long remoteSpanWords = (maxRemote >>> 6) - (minRemote >>> 6) + 1L;
    boolean remoteDistinct;
    if (remoteSpan <= MAX_REMOTE_STAMP_SPAN) {
      remoteDistinct = remoteIdsDistinctThroughStamps(remoteBlockIds, minRemote, (int) remoteSpan);
    } else if (remoteSpanWords <= MAX_REMOTE_BITMAP_WORDS) {
      remoteDistinct =
          remoteIdsDistinctThroughBitmap(remoteBlockIds, minRemote, (int) remoteSpanWords);
    } else {
      remoteDistinct = remoteIdsDistinctBySorting(remoteBlockIds);
    }
    if (!remoteDistinct) {
      throw firstProblem(localNumBlocks, remoteNumBlocks, localBlockIds, remoteBlockIds);
    }

    int[] ls = localBlockIds;
    int[] rs = remoteBlockIds;
    if (!increasing) {
      ls = sortedLocalIds = grow(sortedLocalIds, n);
      rs = sortedRemoteIds = grow(sortedRemoteIds, n);
      long spanWords = (maxLocal >>> 6) - (minLocal >>> 6) + 1L;
      boolean sorted =
          spanWords <= (long) MAX_WORDS_PER_ID_FOR_BITMAP * n
              ? sortThroughBitmap(localBlockIds, remoteBlockIds, localNumBlocks, minLocal, maxLocal)
              : sortPacked(localBlockIds, remoteBlockIds);
      if (!sorted) {
        throw firstProblem(localNumBlocks, remoteNumBlocks, localBlockIds, remoteBlockIds);
      }
    }

    int regions = local.regionsPerLayer();
    long blockBytes = local.blockBytes();
    if ((long) regions * n <= MAX_SCRATCH_COPIES) {
      int most = regions * n;
      // Small plans: one pass into scratch arrays that stay in cache, then exact copies (fresh
      // arrays filled by a copy are not zeroed first).
      long[] lo = scratchLocalOffsets = grow(scratchLocalOffsets, most);
      long[] ro = scratchRemoteOffsets = grow(scratchRemoteOffsets, most);
      long[] sz = scratchSizes = grow(scratchSizes, most);
      int copies = merge(ls, rs, n, regions, localNumBlocks, remoteNumBlocks, blockBytes, lo, ro, sz);
      return new TransferBatch(
          Arrays.copyOf(lo, copies), Arrays.copyOf(ro, copies), Arrays.copyOf(sz, copies));
    }
    int copies =
        merge(ls, rs, n, regions, localNumBlocks, remoteNumBlocks, blockBytes, null, null, null);
    long[] localOffsets = new long[copies];
    long[] remoteOffsets = new long[copies];
    long[] sizes = new long[copies];
    merge(
        ls,
        rs,
        n,
        regions,
        localNumBlocks,
        remoteNumBlocks,
        blockBytes,
        localOffsets,
        remoteOffsets,
        sizes);
    return new TransferBatch(localOffsets, remoteOffsets, sizes);
  }

  /**
   * Plans the copies of one layer when the two sides differ in block size or in which KV heads they
   * hold (different TP sizes): maps token positions, not block ids. Token {@code t} lives in block
   * {@code ids[t / blockSize]}, slot {@code t % blockSize}, on each side; per token and region it
   * moves the heads of {@code heads} (for MLA, the whole latent), and merges copies that are
   * contiguous on both sides, so whole-token slices of adjacent slots and blocks become one copy.
   *
   * <p>Both lists start at the request's first token; they cover {@code min(local blocks x local
   * block size, remote blocks x remote block size)} tokens, and each side's last block must hold
   * some of them (a list with whole blocks beyond the other's, as a prefix-cache hit on one side
   * would give, is refused). Output is in local offset order within each region, K before V.
   *
   * @param local this engine's geometry (its kvHeads are this rank's heads)
   * @param remote the peer's geometry, same layout, head dim (or latent) and element size
   * @param heads which of the local and remote heads to move; ignored for MLA
   * @throws InvalidBlockIdsException if an id is negative, out of range or repeated, or the lists
   *     cover different blocks of the request
   */
  public TransferBatch planTokenRanges(
      KvCacheGeometry local,
      KvCacheGeometry remote,
      @Nullable HeadSlice heads,
      int[] localBlockIds,
      int[] remoteBlockIds)
      throws InvalidBlockIdsException {
    Objects.requireNonNull(local, "local");
    Objects.requireNonNull(remote, "remote");
    Objects.requireNonNull(localBlockIds, "localBlockIds");
    Objects.requireNonNull(remoteBlockIds, "remoteBlockIds");
    requireSameTokenShape(local, remote, heads);
    checkIds("local", localBlockIds, local.numBlocks(), "this engine");
    checkIds("remote", remoteBlockIds, remote.numBlocks(), "the remote engine");
    int nl = localBlockIds.length;
    int nr = remoteBlockIds.length;
    if (nl == 0 && nr == 0) {
      return TransferBatch.EMPTY;
    }
    int bl = local.blockSize();
    int br = remote.blockSize();
    long tokens = Math.min((long) nl * bl, (long) nr * br);
    if (ceilDiv(tokens, bl) != nl || ceilDiv(tokens, br) != nr) {
      throw new InvalidBlockIdsException(
          nl + " local blocks of " + bl + " tokens and " + nr + " remote blocks of " + br
              + " tokens do not cover the same tokens: with different block sizes both lists must"
              + " start at the request's first token (a prefix-cache hit on one side only is not"
              + " supported across block sizes)");
    }
    boolean mla = !local.layout().hasHeads();
    long tokenBytesL = local.tokenBytes();
    long tokenBytesR = remote.tokenBytes();
    long headBytes = mla ? 0 : (long) local.headDim() * local.elementBytes();
    if (!mla) {
      Objects.requireNonNull(heads, "heads of a layout with KV heads");
    }
    long innerL = mla || heads == null ? 0 : heads.localFirst() * headBytes;
    long innerR = mla || heads == null ? 0 : heads.remoteFirst() * headBytes;
    long slice = mla || heads == null ? tokenBytesL : heads.count() * headBytes;
    int regions = local.tokenRegions();
    long strideL = local.blockStrideBytes(); // per token below: computed once
    long strideR = remote.blockStrideBytes();
    int max = (int) Math.min(Integer.MAX_VALUE - 8, tokens * regions);
    long[] lo = new long[Math.min(max, 1024)];
    long[] ro = new long[lo.length];
    long[] sz = new long[lo.length];
    int count = 0;
    for (int region = 0; region < regions; region++) {
      long baseL = region * local.kToVStrideBytes();
      long baseR = region * remote.kToVStrideBytes();
      for (long t = 0; t < tokens; t++) { // long: blocks x block size can pass 2^31 tokens
        long l = baseL + localBlockIds[(int) (t / bl)] * strideL + (t % bl) * tokenBytesL + innerL;
        long r = baseR + remoteBlockIds[(int) (t / br)] * strideR
            + (t % br) * tokenBytesR + innerR;
        if (count > 0
            && lo[count - 1] + sz[count - 1] == l
            && ro[count - 1] + sz[count - 1] == r) {
          sz[count - 1] += slice;
          continue;
        }
        if (count == lo.length) {
          int grown = (int) Math.min(max, (long) lo.length * 2);
          lo = Arrays.copyOf(lo, grown);
          ro = Arrays.copyOf(ro, grown);
          sz = Arrays.copyOf(sz, grown);
        }
        lo[count] = l;
        ro[count] = r;
        sz[count] = slice;
        count++;
      }
    }
    return new TransferBatch(
        Arrays.copyOf(lo, count), Arrays.copyOf(ro, count), Arrays.copyOf(sz, count));
  }

  private static void requireSameTokenShape(
      KvCacheGeometry local, KvCacheGeometry remote, @Nullable HeadSlice heads) {
    if (local.layout().hasHeads() != remote.layout().hasHeads()
        || local.headDim() != remote.headDim()
        || local.latent() != remote.latent()
        || local.elementBytes() != remote.elementBytes()) {
      throw new IllegalArgumentException(
          "geometries cannot exchange tokens (the handshake should have refused them): " + local
              + " and " + remote);
    }
    if (local.layout().hasHeads()) {
      Objects.requireNonNull(heads, "heads");
      if (heads.localFirst() + heads.count() > local.kvHeads()
          || heads.remoteFirst() + heads.count() > remote.kvHeads()) {
        throw new IllegalArgumentException(
            heads + " outside the local " + local.kvHeads() + " or remote " + remote.kvHeads()
                + " heads");
      }
    }
  }

  private static long ceilDiv(long a, long b) {
    return (a + b - 1) / b;
  }

  /** Range and repeat check for one side's list, with the same messages as {@link #plan}. */
  private static void checkIds(String side, int[] ids, int numBlocks, String owner)
      throws InvalidBlockIdsException {
    java.util.BitSet seen = new java.util.BitSet();
    for (int i = 0; i < ids.length; i++) {
      int id = ids[i];
      if (id >= 0 && id < numBlocks && !seen.get(id)) {
        seen.set(id);
        continue;
      }
      throw new InvalidBlockIdsException(Objects.requireNonNull(
          problem(side, id, i, numBlocks, owner, firstPositions(ids, i))));
    }
  }

  private static Map<Integer, Integer> firstPositions(int[] ids, int upTo) {
    Map<Integer, Integer> seen = new HashMap<>();
    for (int i = 0; i < upTo; i++) {
      seen.putIfAbsent(ids[i], i);
    }
    return seen;
  }

  /**
   * Walks the copies in local offset order (all K, then all V; positions in blocks), merging each
   * run that advances by one block on both sides. Writes the copies when given arrays; returns
   * their count. Merged size is last local + block - first local, as in the seed.
   */
  private static int merge(
      int[] ls,
      int[] rs,
      int n,
      int regions,
      long localNumBlocks,
      long remoteNumBlocks,
      long blockBytes,
      long @Nullable [] localOffsets,
      long @Nullable [] remoteOffsets,
      long @Nullable [] sizes) {
    int count = 0;
    long startL = ls[0];
    long startR = rs[0];
    long prevL = startL;
    long prevR = startR;
    for (int region = 0; region < regions; region++) {
      long baseL = region * localNumBlocks;
      long baseR = region * remoteNumBlocks;
      for (int i = region == 0 ? 1 : 0; i < n; i++) {
        long l = baseL + ls[i];
        long r = baseR + rs[i];
        if (l != prevL + 1 || r != prevR + 1) {
          if (sizes != null && localOffsets != null && remoteOffsets != null) {
            localOffsets[count] = startL * blockBytes;
            remoteOffsets[count] = startR * blockBytes;
            sizes[count] = (prevL + 1 - startL) * blockBytes;
          }
          count++;
          startL = l;
          startR = r;
        }
        prevL = l;
        prevR = r;
      }
    }
    if (sizes != null && localOffsets != null && remoteOffsets != null) {
      localOffsets[count] = startL * blockBytes;
      remoteOffsets[count] = startR * blockBytes;
      sizes[count] = (prevL + 1 - startL) * blockBytes;
    }
    return count + 1;
  }

  /** Ids lie within {@code span} ids from {@code minRemote}. */
  private boolean remoteIdsDistinctThroughStamps(int[] remoteBlockIds, int minRemote, int span) {
    int[] stamps = remoteStamps;
    if (stamps.length < span) {
      stamps = remoteStamps = new int[span]; // all 0: no stamp
    }
    int mark = ++stamp;
    if (mark == 0) { // wrapped after 2^32 calls: old stamps could repeat from here on
      Arrays.fill(stamps, 0);
      mark = stamp = 1;
    }
    for (int r : remoteBlockIds) {
      int i = r - minRemote;
      if (stamps[i] == mark) {
        return false;
      }
      stamps[i] = mark;
    }
    return true;
  }

  /** Ids lie within {@code spanWords} words from {@code minRemote}. Leaves the bitmap clear. */
  private boolean remoteIdsDistinctThroughBitmap(
      int[] remoteBlockIds, int minRemote, int spanWords) {
    long[] bits = remoteIdBits = grow(remoteIdBits, spanWords);
    int firstWord = minRemote >>> 6;
    boolean distinct = true;
    int n = remoteBlockIds.length;
    for (int i = 0; i < n; i++) {
      int r = remoteBlockIds[i];
      int w = (r >>> 6) - firstWord;
      long word = bits[w];
      long bit = 1L << r;
      if ((word & bit) != 0) {
        distinct = false;
        break;
      }
      bits[w] = word | bit;
    }
    for (int i = 0; i < n; i++) {
      bits[(remoteBlockIds[i] >>> 6) - firstWord] = 0;
    }
    return distinct;
  }

  private boolean remoteIdsDistinctBySorting(int[] remoteBlockIds) {
    int n = remoteBlockIds.length;
    int[] copy = remoteIdsCopy = grow(remoteIdsCopy, n);
    System.arraycopy(remoteBlockIds, 0, copy, 0, n);
    Arrays.sort(copy, 0, n);
    for (int i = 1; i < n; i++) {
      if (copy[i] == copy[i - 1]) {
        return false;
      }
    }
    return true;
  }

  /**
   * Fills the sorted scratch arrays by marking local ids in a bitmap and reading it back in order;
   * ids are in range. Returns false on a repeated local id. Leaves the local bitmap clear.
   */
  private boolean sortThroughBitmap(
      int[] localBlockIds, int[] remoteBlockIds, int localNumBlocks, int minLocal, int maxLocal) {
    long[] bits = localIdBits = grow(localIdBits, words(localNumBlocks));
    int[] remoteOf = remoteIdByLocalId = grow(remoteIdByLocalId, localNumBlocks);
    int n = localBlockIds.length;
    boolean distinct = true;
    for (int i = 0; i < n; i++) {
      int l = localBlockIds[i];
      long word = bits[l >>> 6];
      long bit = 1L << l;
      if ((word & bit) != 0) {
        distinct = false;
        break;
      }
      bits[l >>> 6] = word | bit;
      remoteOf[l] = remoteBlockIds[i];
    }
    int[] ls = sortedLocalIds;
    int[] rs = sortedRemoteIds;
    int k = 0;
    int lastWord = maxLocal >>> 6;
    for (int w = minLocal >>> 6; w <= lastWord; w++) {
      long word = bits[w];
      if (word == 0) {
        continue;
      }
      bits[w] = 0;
      if (!distinct) {
        continue;
      }
      int base = w << 6;
      while (word != 0) {
        int l = base + Long.numberOfTrailingZeros(word);
        ls[k] = l;
        rs[k] = remoteOf[l];
        k++;
        word &= word - 1;
      }
    }
    return distinct;
  }

  /** Fills the sorted scratch arrays by sorting (local, remote) pairs packed in a long. */
  private boolean sortPacked(int[] localBlockIds, int[] remoteBlockIds) {
    int n = localBlockIds.length;
    long[] packed = packedIds = grow(packedIds, n);
    for (int i = 0; i < n; i++) {
      packed[i] = ((long) localBlockIds[i] << 32) | remoteBlockIds[i];
    }
    Arrays.sort(packed, 0, n);
    int[] ls = sortedLocalIds;
    int[] rs = sortedRemoteIds;
    int previous = -1;
    for (int i = 0; i < n; i++) {
      int l = (int) (packed[i] >>> 32);
      if (l == previous) {
        return false;
      }
      ls[i] = l;
      rs[i] = (int) packed[i];
      previous = l;
    }
    return true;
  }

  private static void requireRemoteFits(KvCacheGeometry local, int remoteNumBlocks) {
    if (remoteNumBlocks < 1) {
      throw new IllegalArgumentException(
          "remote engine must have at least 1 block, got " + remoteNumBlocks);
    }
    try {
      Math.multiplyExact(local.blockBytes(), (long) remoteNumBlocks * local.regionsPerLayer());
    } catch (ArithmeticException e) {
      throw new IllegalArgumentException(
          "remote KV cache of " + remoteNumBlocks + " blocks would exceed 2^63 bytes per layer", e);
    }
  }

  private static int words(int bits) {
    return (bits + 63) >>> 6;
  }

  private static long[] grow(long[] array, int length) {
    return array.length >= length ? array : new long[length];
  }

  private static int[] grow(int[] array, int length) {
    return array.length >= length ? array : new int[length];
  }

  private static InvalidBlockIdsException lengthMismatch(int[] local, int[] remote) {
    int position = Math.min(local.length, remote.length);
    String unmatched =
        local.length > remote.length
            ? "local block id " + local[position] + " at position " + position
                + " has no remote block"
            : "remote block id " + remote[position] + " at position " + position
                + " has no local block";
    return new InvalidBlockIdsException(
        unmatched
            + ": "
            + local.length
            + " local block ids but "
            + remote.length
            + " remote block ids; each local block needs exactly one remote block");
  }

  /** The error path: finds the first offending id in request order and says what is wrong. */
  private static InvalidBlockIdsException firstProblem(
      int localNumBlocks, int remoteNumBlocks, int[] local, int[] remote) {
    Map<Integer, Integer> seenLocal = new HashMap<>();
    Map<Integer, Integer> seenRemote = new HashMap<>();
    for (int i = 0; i < local.length; i++) {
      String problem = problem("local", local[i], i, localNumBlocks, "this engine", seenLocal);
      if (problem == null) {
        problem = problem("remote", remote[i], i, remoteNumBlocks, "the remote engine", seenRemote);
      }
      if (problem != null) {
        return new InvalidBlockIdsException(problem);
      }
    }
    throw new IllegalStateException("planner flagged block ids but found nothing wrong: a bug");
  }

  private static @Nullable String problem(
      String side, int id, int position, int numBlocks, String owner, Map<Integer, Integer> seen) {
    String prefix = side + " block id " + id + " at position " + position;
    if (id < 0) {
      return prefix + " is negative; block ids start at 0";
    }
    if (id >= numBlocks) {
      return prefix
          + " is out of range: "
          + owner
          + " has "
          + numBlocks
          + " blocks (ids 0 to "
          + (numBlocks - 1)
          + ")";
    }
    Integer earlier = seen.putIfAbsent(id, position);
    if (earlier != null) {
      return prefix + " repeats position " + earlier + "; each block may appear once per request";
    }
    return null;
  }
}
