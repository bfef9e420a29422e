package dev.kvferry.rdma;

import dev.kvferry.rdma.cuda.CudaEvent;
import java.util.List;

/**
 * A transport whose copies can be ordered on the GPU: they start once a CUDA event has fired (no
 * CPU wait), and a word can be stored behind them so the peer learns of their end with no message.
 * A component resolves this capability once ({@code transport instanceof EventOrderedTransport}),
 * not at each use.
 */
public interface EventOrderedTransport extends Transport {

  /**
   * Like {@link #write}, but the copies start on the GPU only once {@code after} (the layer's
   * compute event) has fired; returns at once. The event's record at the time of this call counts.
   */
  TransferStatus writeAfter(
      CudaEvent after, MemoryRegion local, RegionDescriptor remote, TransferBatch batch);

  /** Like {@link #read}, ordered behind {@code after} on the GPU. */
  TransferStatus readAfter(
      CudaEvent after, MemoryRegion local, RegionDescriptor remote, TransferBatch batch);

  /**
   * Queues a store of {@code value} to {@code wordDeviceAddress} (a {@link
   * dev.kvferry.rdma.cuda.SharedDoneWords} word of the peer) behind every copy queued so far
   * between {@code local}'s device and {@code remote}'s owner: the peer sees the value only after
   * those bytes have landed. Returns at once.
   */
  void signalWhenCopied(
      MemoryRegion local, RegionDescriptor remote, long wordDeviceAddress, long value);

  /**
   * Records {@code event} (of {@code local}'s device) behind every copy queued so far between
   * {@code local}'s device and the owner of each of {@code remotes}: a stream that waits for it
   * (in this process or, for an interprocess event, another) sees those copies' bytes. The copies
   * of several peers run on several streams, joined on the GPU before the record. Returns at once;
   * no CPU thread waits.
   */
  void recordAfterCopies(CudaEvent event, MemoryRegion local, List<RegionDescriptor> remotes);
}
