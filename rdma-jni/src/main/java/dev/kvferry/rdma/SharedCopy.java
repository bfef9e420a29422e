package dev.kvferry.rdma;

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

  private final long[] local;
  private final long[] remote;
  private final long[] length;
  /** Piece index where chunk c starts; {@code chunkStart[chunks]} is the number of pieces. */
  private final int[] chunkStart;
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
      long total, TransferStatus status) {
    int pieces = 0;
    for (int i = 0; i < runs; i++) {
      pieces += (int) ((runLength[i] + CHUNK_BYTES - 1) / CHUNK_BYTES);
    }
    local = new long[pieces];
    remote = new long[pieces];
    length = new long[pieces];
    int[] starts = new int[pieces + 1];
    int p = 0;
    int c = 0;
    long inChunk = 0;
    for (int i = 0; i < runs; i++) {
      for (long done = 0; done < runLength[i]; ) {
        long n = Math.min(CHUNK_BYTES, runLength[i] - done);
        if (inChunk == 0) {
          starts[c++] = p;
        }
        local[p] = runLocal[i] + done;
        remote[p] = runRemote[i] + done;
        length[p] = n;
        p++;
        done += n;
        inChunk += n;
        if (inChunk >= CHUNK_BYTES) {
          inChunk = 0;
        }
      }
    }
    starts[c] = p;
    this.chunkStart = starts;
    this.chunks = c;
    this.toRemote = toRemote;
    this.total = total;
    this.status = status;
    this.left = new AtomicInteger(c);
  }

  /** Copies chunks until none is left to take; the thread that copies the last one succeeds the status. */
  void work() {
    boolean first = true;
    for (int c = next.getAndIncrement(); c < chunks; c = next.getAndIncrement()) {
      if (first) {
        if (c == 0) {
          CopyStamps.started();
        } else {
          CopyStamps.joined();
        }
        first = false;
      }
      for (int p = chunkStart[c]; p < chunkStart[c + 1]; p++) {
        if (toRemote) {
          LibC.memmove(remote[p], local[p], length[p]);
        } else {
          LibC.memmove(local[p], remote[p], length[p]);
        }
      }
      if (left.decrementAndGet() == 0) {
        CopyStamps.copied(); // the CPU time is then this thread's alone
        status.succeed(total);
      }
    }
  }
}
