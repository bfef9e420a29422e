package dev.kvferry.rdma;

import java.io.IOException;
import java.nio.channels.SocketChannel;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.TimeUnit;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Closes connections that are busy (in a handshake or a frame) but have made no progress for the
 * I/O timeout. Blocking channels have no read timeout of their own; closing one from here wakes
 * the thread blocked on it with an exception, so no transfer waits forever on a dead peer.
 */
final class IoWatchdog implements AutoCloseable {
  private static final Logger log = LoggerFactory.getLogger(IoWatchdog.class);

  private final long timeoutNs;
  private final Map<SocketChannel, Entry> watched = new ConcurrentHashMap<>();
  private final ScheduledExecutorService timer;

  private record Entry(TcpWire.Progress progress, String what) {}

  IoWatchdog(String name, long timeoutNs) {
    this.timeoutNs = timeoutNs;
    this.timer =
        Executors.newSingleThreadScheduledExecutor(
            r -> {
              Thread t = new Thread(r, "kvferry-" + name + "-watchdog");
              t.setDaemon(true);
              return t;
            });
    long periodNs = Math.max(TimeUnit.MILLISECONDS.toNanos(20), Math.min(timeoutNs / 4, TimeUnit.SECONDS.toNanos(1)));
    timer.scheduleWithFixedDelay(this::check, periodNs, periodNs, TimeUnit.NANOSECONDS);
  }

  void watch(SocketChannel channel, TcpWire.Progress progress, String what) {
    watched.put(channel, new Entry(progress, what));
  }

  void forget(SocketChannel channel) {
    watched.remove(channel);
  }

  private void check() {
    long now = System.nanoTime();
    for (Map.Entry<SocketChannel, Entry> e : watched.entrySet()) {
      TcpWire.Progress p = e.getValue().progress();
      if (p.busySinceNs != 0 && now - p.lastProgressNs > timeoutNs) {
        log.warn(
            "closing {}: no progress for {} ms", e.getValue().what(),
            TimeUnit.NANOSECONDS.toMillis(now - p.lastProgressNs));
        p.timedOut = true;
        watched.remove(e.getKey());
        try {
          e.getKey().close();
        } catch (IOException ignored) {
          // closing is all we wanted
        }
      }
    }
  }

  long timeoutNs() {
    return timeoutNs;
  }

  @Override
  public void close() {
    timer.shutdownNow();
  }
}
