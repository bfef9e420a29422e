package dev.kvferry.rdma;

import java.util.Queue;
import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.atomic.AtomicInteger;

/**
 * One large copy through a mapping, cut into chunks that several threads take in turn, each as
 * soon as it wakes; whichever copies the last chunk completes the status. A thread that wakes
 * after every chunk is taken copies nothing, so one slow wake-up never holds the transfer back.
 * A single thread's memcpy is bound well below the memory's bandwidth: on this project's 2-core
 * VM two threads moved 256 MiB and 1 GiB batches about twice as fast as one
 * (docs/performance.md, "cma copy threads").
 *
 * <p>Every thread that copies holds its own pins of the local region and of the peer's mapping,
 * taken before it was handed the copy, so the memory outlives each thread's last chunk.
 */
final class SharedCopy {

  /** Bytes a thread takes at a time: large enough that claiming one is noise, small enough to share. */
  static final long CHUNK_BYTES = 1 << 20;

  /**
   * The copy's pieces (runs cut at chunk size), reused through a {@link Pool}: fresh arrays per
   * copy came to about 7 KiB per 8 MiB layer, 240 KiB per request in the bench's e2e rows.
   */
  static final class Pieces {
    long[] local = new long[0];
    long[] remote = new long[0];
    long[] length = new long[0];
    /** Piece index where chunk c starts; {@code chunkStart[chunks]} is the number of pieces. */
    int[] chunkStart = new int[0];

    void ensureCapacity(int pieces) {
      if (local.length < pieces) {
        int n = Math.max(pieces, 2 * local.length);
        local = new long[n];
        remote = new long[n];
        length = new long[n];
        chunkStart = new int[n + 1];
      }
    }
  }

  /** A few {@link Pieces} kept for the next copies (more than the copies in flight is waste). */
  static final class Pool {
    private static final int KEPT = 8;
    private final Queue<Pieces> free = new ConcurrentLinkedQueue<>();
    private final AtomicInteger size = new AtomicInteger();

    Pieces take() {
      Pieces p = free.poll();
      if (p == null) {
        return new Pieces();
      }
      size.decrementAndGet();
      return p;
    }

    void give(Pieces p) {
      if (size.incrementAndGet() <= KEPT) {
        free.add(p);
      } else {
        size.decrementAndGet();
      }
    }
  }

  private final Pieces pieces;
  private final Pool pool;
  private final int chunks;
  private final boolean toRemote;
  private final long total;
  private final TransferStatus status;
  private final AtomicInteger next = new AtomicInteger();
  private final AtomicInteger left;

  /**
   * @param runs number of runs in {@code runLocal}/{@code runRemote}/{@code runLength} (address
   *     pairs already bounds-checked, in copy order); runs longer than a chunk are cut
   */
  SharedCopy(long[] runLocal, long[] runRemote, long[] runLength, int runs, boolean toRemote,
      long total, TransferStatus status, Pool pool) {
    int count = 0;
    for (int i = 0; i < runs; i++) {
      count += (int) ((runLength[i] + CHUNK_BYTES - 1) / CHUNK_BYTES);
    }
    Pieces ps = pool.take();
    ps.ensureCapacity(count);
    int p = 0;
    int c = 0;
    long inChunk = 0;
    for (int i = 0; i < runs; i++) {
      for (long done = 0; done < runLength[i]; ) {
        long n = Math.min(CHUNK_BYTES, runLength[i] - done);
        if (inChunk == 0) {
          ps.chunkStart[c++] = p;
        }
        ps.local[p] = runLocal[i] + done;
        ps.remote[p] = runRemote[i] + done;
        ps.length[p] = n;
        p++;
        done += n;
        inChunk += n;
        if (inChunk >= CHUNK_BYTES) {
          inChunk = 0;
        }
      }
    }
    ps.chunkStart[c] = p;
    this.pieces = ps;
    this.pool = pool;
    this.chunks = c;
    this.toRemote = toRemote;
    this.total = total;
    this.status = status;
    this.left = new AtomicInteger(c);
  }

  /**
   * Copies chunks until none is left to take; the thread that copies the last one gives the
   * pieces back (every chunk is copied then, and a thread that wakes later reads none) and
   * succeeds the status.
   */
  void work() {
    Pieces ps = pieces;
    for (int c = next.getAndIncrement(); c < chunks; c = next.getAndIncrement()) {
      if (c == 0) {
        CopyStamps.started();
      }
      for (int p = ps.chunkStart[c]; p < ps.chunkStart[c + 1]; p++) {
        if (toRemote) {
          LibC.memmove(ps.remote[p], ps.local[p], ps.length[p]);
        } else {
          LibC.memmove(ps.local[p], ps.remote[p], ps.length[p]);
        }
      }
      if (left.decrementAndGet() == 0) {
        pool.give(ps);
        CopyStamps.copied();
        status.succeed(total);
      }
    }
  }
}
