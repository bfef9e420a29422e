package dev.kvferry.rdma;

import org.jspecify.annotations.Nullable;

/**
 * Same-process transport: the remote region is registered in this process (looked up by id in the
 * given registry) and bytes move with a plain memory copy. Used by single-JVM tests and the demo's
 * {@code --transport local}.
 */
public final class LocalTransport implements Transport {

  private final RegionRegistry[] reachable;

  /** @param reachable registries whose regions count as "remote" peers in this process */
  public LocalTransport(RegionRegistry... reachable) {
    this.reachable = reachable.clone();
  }

  @Override
  public String name() {
    return "local";
  }

  @Override
  public TransferStatus write(MemoryRegion local, RegionDescriptor remote, TransferBatch batch) {
    return copy(local, remote, batch, true);
  }

  @Override
  public TransferStatus read(MemoryRegion local, RegionDescriptor remote, TransferBatch batch) {
    return copy(local, remote, batch, false);
  }

  private TransferStatus copy(
      MemoryRegion local, RegionDescriptor remote, TransferBatch batch, boolean toRemote) {
    MemoryRegion target = find(remote);
    if (target == null) {
      return TransferStatus.failed(
          "local transport: region " + remote.regionId() + " of " + remote.owner()
              + " is not registered in this process");
    }
    if (local.kind() != RegionKind.HOST || target.kind() != RegionKind.HOST) {
      return TransferStatus.failed("local transport moves host memory only");
    }
    if (!local.tryPin()) {
      return TransferStatus.failed("local transport: local region " + local.id() + " is closed");
    }
    if (!target.tryPin()) {
      local.unpin();
      return TransferStatus.failed(
          "local transport: region " + remote.regionId() + " of " + remote.owner() + " is closed");
    }
    try {
      for (int i = 0; i < batch.count(); i++) {
        local.checkRange(batch.localOffsets()[i], batch.sizes()[i]);
        remote.checkRange(batch.remoteOffsets()[i], batch.sizes()[i]);
        target.checkRange(batch.remoteOffsets()[i], batch.sizes()[i]);
      }
      for (int i = 0; i < batch.count(); i++) {
        long l = local.address() + batch.localOffsets()[i];
        long r = target.address() + batch.remoteOffsets()[i];
        long n = batch.sizes()[i];
        if (n > 0) {
          LibC.memmove(toRemote ? r : l, toRemote ? l : r, n);
        }
      }
    } catch (RegionBoundsException e) {
      return TransferStatus.failed(String.valueOf(e.getMessage()));
    } finally {
      target.unpin();
      local.unpin();
    }
    return TransferStatus.succeeded(batch.totalBytes());
  }

  private @Nullable MemoryRegion find(RegionDescriptor remote) {
    for (RegionRegistry registry : reachable) {
      MemoryRegion r = registry.lookup(remote.regionId());
      if (r != null && r.address() == remote.baseAddress() && r.owner().equals(remote.owner())) {
        return r;
      }
    }
    return null;
  }

  @Override
  public RegionDescriptor describe(MemoryRegion local) {
    return local.descriptor();
  }

  @Override
  public void close() {}
}
