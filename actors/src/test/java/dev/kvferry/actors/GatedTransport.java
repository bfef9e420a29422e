package dev.kvferry.actors;

import dev.kvferry.rdma.MemoryRegion;
import dev.kvferry.rdma.RegionDescriptor;
import dev.kvferry.rdma.TransferBatch;
import dev.kvferry.rdma.TransferStatus;
import dev.kvferry.rdma.Transport;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.atomic.AtomicInteger;

/**
 * A real transport whose copies stay in flight until the test opens the gate, as a GPU or RDMA
 * copy is in flight after its submission returned: each write or read returns a pending status at
 * once and moves its bytes (through the wrapped transport) only when {@link #open} is called.
 */
final class GatedTransport implements Transport {

  private final Transport delegate;
  private final List<Held> held = new ArrayList<>();

  private record Held(MemoryRegion local, Runnable land) {}
  private final AtomicInteger submitted = new AtomicInteger();
  private boolean open;

  GatedTransport(Transport delegate) {
    this.delegate = delegate;
  }

  /** Copies submitted so far (held or done). */
  int submitted() {
    return submitted.get();
  }

  /** Lets every held copy run, and every later one at once. */
  void open() {
    List<Held> run;
    synchronized (this) {
      open = true;
      run = new ArrayList<>(held);
      held.clear();
    }
    run.forEach(h -> h.land().run());
  }

  /** Lets the held copies of one local region (one layer) run; the gate stays shut for others. */
  void openFor(MemoryRegion local) {
    List<Held> run = new ArrayList<>();
    synchronized (this) {
      held.removeIf(h -> {
        if (h.local() == local) {
          run.add(h);
          return true;
        }
        return false;
      });
    }
    run.forEach(h -> h.land().run());
  }

  private TransferStatus gate(MemoryRegion local, java.util.function.Supplier<TransferStatus> copy) {
    submitted.incrementAndGet();
    TransferStatus pending = TransferStatus.pending();
    Runnable land =
        () -> {
          TransferStatus s = copy.get();
          if (s.succeeded()) {
            pending.succeed(s.bytesMoved());
          } else {
            pending.fail(s.failureMessage());
          }
        };
    synchronized (this) {
      if (!open) {
        held.add(new Held(local, land));
        return pending;
      }
    }
    land.run();
    return pending;
  }

  @Override
  public String name() {
    return delegate.name();
  }

  @Override
  public TransferStatus write(MemoryRegion local, RegionDescriptor remote, TransferBatch batch) {
    return gate(local, () -> delegate.write(local, remote, batch));
  }

  @Override
  public TransferStatus read(MemoryRegion local, RegionDescriptor remote, TransferBatch batch) {
    return gate(local, () -> delegate.read(local, remote, batch));
  }

  @Override
  public RegionDescriptor describe(MemoryRegion local) {
    return delegate.describe(local);
  }

  @Override
  public void close() {
    delegate.close();
  }
}
