package dev.kvferry.rdma;

/** Where a registered region's bytes live. */
public enum RegionKind {
  /** Host memory of the owning process. */
  HOST,
  /** Device memory of one GPU (reached through CUDA IPC by peers on the same host). */
  CUDA
}
