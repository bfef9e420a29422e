package dev.kvferry.rdma;

import dev.kvferry.rdma.cuda.CudaEvent;

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
}
