package dev.kvferry.engine.port;

import dev.kvferry.rdma.CudaTransport;
import dev.kvferry.rdma.MemoryRegion;
import dev.kvferry.rdma.RegionKind;
import dev.kvferry.rdma.RegionRegistry;
import dev.kvferry.rdma.cuda.Cuda;
import java.nio.ByteBuffer;
import java.util.HashMap;
import java.util.Map;

/**
 * One worker's GPU memory opened from the engine's CUDA IPC handles: each allocation once (CUDA
 * opens an allocation once per process), each layer a region inside it, and the allocation
 * closed (cudaIpcCloseMemHandle) when the last of its regions is closed and no copy uses it.
 * Peers are given the engine's own handle and offset, as CUDA cannot re-export imported memory.
 */
final class ImportedGpuMemory {

  private final int device;
  private final Map<ByteBuffer, Allocation> byHandle = new HashMap<>();

  /** One opened allocation: its base here, its size, and how many regions still use it. */
  private static final class Allocation {
    final long base;
    final long bytes;
    int regions;

    Allocation(long base, long bytes) {
      this.base = base;
      this.bytes = bytes;
    }
  }

  ImportedGpuMemory(int device) {
    this.device = device;
  }

  /** Opens {@code handle}'s allocation if not yet open and registers one layer inside it. */
  MemoryRegion register(RegionRegistry registry, byte[] handle, long offset, long length)
      throws PortException {
    Cuda.setDevice(device);
    ByteBuffer key = ByteBuffer.wrap(handle.clone());
    Allocation a = byHandle.get(key);
    if (a == null) {
      long base = Cuda.ipcOpenMemHandle(handle);
      long[] range = Cuda.allocationRange(base);
      a = new Allocation(base, range[0] + range[1] - base);
      byHandle.put(key, a);
    }
    if (offset > a.bytes || length > a.bytes - offset) {
      if (a.regions == 0) {
        close(a);
        byHandle.remove(key);
      }
      throw new PortException(PortError.BAD_MEMORY, length + " bytes at offset " + offset
          + " do not fit the allocation of " + a.bytes + " bytes the IPC handle opened");
    }
    long address = a.base + offset;
    CudaTransport.describeImportedAs(address, handle, offset);
    Allocation owner = a;
    owner.regions++;
    return registry.registerExternal(address, length, RegionKind.CUDA, device, () -> {
      CudaTransport.forgetImported(address);
      release(owner);
    });
  }

  private void release(Allocation a) {
    boolean last;
    synchronized (this) {
      last = --a.regions == 0;
    }
    if (last) {
      close(a);
    }
  }

  private void close(Allocation a) {
    Cuda.setDevice(device);
    Cuda.ipcCloseMemHandle(a.base);
  }
}
