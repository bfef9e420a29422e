package dev.kvferry.engine.port;

import java.nio.file.Path;
import java.util.List;

/** Where a worker's KV cache is, as its hello names it (docs/engine-port.md, hello.memory). */
sealed interface WorkerMemory {

  int layers();

  /** Host memory: each layer's bytes in a file under /dev/shm the engine shares. */
  record Host(List<Layer> layerFiles) implements WorkerMemory {
    /** One layer's bytes in a shared file. */
    record Layer(Path path, long offset, long length) {}

    @Override
    public int layers() {
      return layerFiles.size();
    }
  }

  /**
   * GPU memory shared through CUDA IPC: per layer the 64-byte handle of the allocation holding
   * it and the layer's offset in that allocation, on the GPU named by its UUID; and the worker's
   * ring of interprocess events, which {@code save_kv_layer} names by slot.
   */
  record CudaIpc(String deviceUuid, List<Layer> layerHandles, List<byte[]> eventHandles)
      implements WorkerMemory {
    /** One layer: its allocation's IPC handle and where in that allocation it starts. */
    record Layer(byte[] handle, long offset, long length) {}

    @Override
    public int layers() {
      return layerHandles.size();
    }
  }
}
