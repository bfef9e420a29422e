package dev.kvferry.rdma;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import ch.qos.logback.classic.Logger;
import ch.qos.logback.classic.spi.ILoggingEvent;
import ch.qos.logback.core.AppenderBase;
import java.io.IOException;
import java.io.InputStream;
import java.net.Socket;
import java.net.SocketException;
import java.net.SocketTimeoutException;
import java.nio.ByteBuffer;
import java.time.Duration;
import java.util.Map;
import java.util.Random;
import java.util.TreeMap;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.LongAdder;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.slf4j.LoggerFactory;

/**
 * Fuzzes the TCP data port's parser (hello, frame header, entry table, payload) with what a
 * hostile or broken client could send: random bytes, valid messages with bytes mutated, entries
 * at and past the edges of the region (negative, overflowing, huge), unknown ops and regions,
 * streams cut anywhere. Each input is a fresh connection that sends its bytes and half-closes.
 *
 * <p>Invariants after every input: the listener ends the exchange (answers and closes, or closes)
 * within the client's deadline; not one byte changes outside the registered region (it sits
 * between two guard pages of the same mapping, which the listener cannot name); after every
 * hundred inputs, a good client still writes and reads back bytes exactly.
 *
 * <p>Runs {@code kvferry.fuzz.seconds} seconds (default 3, for CI); {@code kvferry.fuzz.seed}
 * replays a reported failure.
 */
class TcpListenerFuzzTest {
  private static final Duration BUDGET =
      Duration.ofMillis((long) (Double.parseDouble(System.getProperty("kvferry.fuzz.seconds", "3")) * 1000));
  private static final long SEED = Long.getLong("kvferry.fuzz.seed", new Random().nextLong());
  private static final int PAGE = (int) RegionRegistry.PAGE_BYTES;
  private static final int LENGTH = 16 * PAGE;
  private static final byte GUARD = (byte) 0xA5;
  /**
   * Every refusal the listener can give a host region, numbers masked: the fuzzer must reach each
   * (after its budget it goes on, up to {@link #COVERAGE_DEADLINE}, until it has). Left out: the
   * GPU-staging refusal (no GPU region here) and failed copies into or out of host memory.
   */
  private static final java.util.Set<String> EVERY_REFUSAL = java.util.Set.of(
      "bad token for the regions of DN",
      "frame of N entries (expected N..N)",
      "garbage frame: unknown op N",
      "garbage hello: not a kvferry tcp peer",
      "oversized entry of N bytes (at most N)",
      "range [N, N + N) lies outside region N of DN (N bytes)",
      "region N is not registered at DN",
      "token of N bytes (expected N..N)",
      "truncated frame entries: connection closed after N of N bytes",
      "truncated frame header: connection closed after N of N bytes",
      "truncated hello: connection closed after N of N bytes",
      "truncated payload: connection closed after N of N bytes",
      "truncated token: connection closed after N of N bytes",
      "unsupported protocol version N (this listener speaks N)");
  /** How long past its budget the fuzzer may run to reach every refusal: a bound, not a goal. */
  private static final Duration COVERAGE_DEADLINE = Duration.ofSeconds(120);
  /** A deadline against a listener that never ends an exchange, not a timing assertion. */
  private static final int CLIENT_DEADLINE_MS = 20_000;

  private RegionRegistry unregistered;
  private RegionRegistry served;
  private RegionRegistry ours;
  private TcpTransport listener;
  private TcpTransport goodClient;
  private MemoryRegion mapping;
  private MemoryRegion target;
  private RegionDescriptor descriptor;
  /** The listener's refusals by reason (numbers masked): shows which parser paths were reached. */
  private final Map<String, LongAdder> refusals = new ConcurrentHashMap<>();
  private final Logger listenerLog = (Logger) LoggerFactory.getLogger(TcpListener.class);
  private final AppenderBase<ILoggingEvent> countRefusals = new AppenderBase<>() {
    @Override
    protected void append(ILoggingEvent e) {
      String m = e.getFormattedMessage();
      int at = m.indexOf("closed connection");
      String reason = (at < 0 ? m : m.substring(m.indexOf(": ", at) + 2)).replaceAll("-?\\d+", "N");
      refusals.computeIfAbsent(reason, k -> new LongAdder()).increment();
    }
  };

  @BeforeEach
  void open() throws IOException {
    // Thousands of refusals: counted, not printed.
    listenerLog.setAdditive(false);
    countRefusals.start();
    listenerLog.addAppender(countRefusals);
    // One mapping: guard page | the served region | guard page. Only the middle is registered with
    // the listener's registry, so any byte written to a guard page escaped the bounds checks.
    unregistered = new RegionRegistry("guards");
    mapping = unregistered.allocateHost(LENGTH + 2L * PAGE);
    Patterns.fillConstant(mapping, GUARD);
    served = new RegionRegistry("D0");
    target = served.registerExternal(mapping.address() + PAGE, LENGTH, RegionKind.HOST, -1);
    listener =
        new TcpTransport(served, TransportOptions.defaults().withIoTimeout(Duration.ofMillis(300)));
    ours = new RegionRegistry("P0");
    goodClient = new TcpTransport(ours, TransportOptions.defaults().withTcpListener(false));
    descriptor = listener.describe(target);
  }

  @AfterEach
  void close() {
    listenerLog.detachAppender(countRefusals);
    listenerLog.setAdditive(true);
    goodClient.close();
    listener.close();
    ours.close();
    target.close();
    served.close();
    unregistered.close();
  }

  @Test
  void hostileStreamsNeverWriteOutsideTheRegionNorHangAndTheListenerKeepsServing()
      throws Exception {
    Random random = new Random(SEED);
    long deadline = System.nanoTime() + BUDGET.toNanos();
    long coverageDeadline = deadline + COVERAGE_DEADLINE.toNanos();
    int runs = 0;
    while (System.nanoTime() < deadline
        || (!refusals.keySet().containsAll(EVERY_REFUSAL) && System.nanoTime() < coverageDeadline)) {
      byte[] input = nextInput(random);
      try {
        exchange(input);
      } catch (SocketTimeoutException e) {
        throw new AssertionError("the listener neither answered nor closed within "
            + CLIENT_DEADLINE_MS + " ms (seed " + SEED + ", input " + runs + ", "
            + input.length + " bytes)", e);
      }
      assertGuardsIntact(runs);
      if (++runs % 100 == 0) {
        assertGoodClientStillSucceeds(runs);
      }
    }
    assertGoodClientStillSucceeds(runs);
    System.out.printf("tcp listener fuzz: %d inputs (budget %d ms), seed %d; %d distinct refusal"
        + " reasons:%n", runs, BUDGET.toMillis(), SEED, refusals.size());
    new TreeMap<>(refusals).forEach((reason, n) -> System.out.printf("  %6d  %s%n", n.sum(), reason));
    java.util.Set<String> missed = new java.util.TreeSet<>(EVERY_REFUSAL);
    missed.removeAll(refusals.keySet());
    assertTrue(missed.isEmpty(), "after " + runs + " inputs (seed " + SEED + ") the fuzzer never"
        + " reached these refusals: " + missed);
  }

  /** Sends {@code input}, half-closes, and drains whatever comes back until the listener closes. */
  private void exchange(byte[] input) throws IOException {
    try (Socket s = new Socket(descriptor.tcpHost(), descriptor.tcpPort())) {
      s.setSoTimeout(CLIENT_DEADLINE_MS);
      try {
        s.getOutputStream().write(input);
        s.shutdownOutput();
      } catch (SocketException closedEarly) {
        // The listener refused and closed before reading everything: fine.
      }
      InputStream in = s.getInputStream();
      byte[] sink = new byte[64 * 1024];
      try {
        while (in.read(sink) >= 0) {
          // A READ frame's bytes, or acks.
        }
      } catch (SocketException reset) {
        // A reset is a close too.
      }
    }
  }

  private byte[] nextInput(Random r) {
    switch (r.nextInt(6)) {
      case 0:
        return randomBytes(r, r.nextInt(64));
      case 1:
        return concat(mutate(r, hello(served.token())), randomBytes(r, r.nextInt(200)));
      case 2:
        return concat(hello(served.token()), mutate(r, frame(r)));
      case 3:
        return cut(r, concat(hello(served.token()), frame(r), frame(r)));
      case 4:
        return concat(hello(served.token()), frame(r), randomBytes(r, r.nextInt(100)));
      default:
        return mutate(r, concat(hello(served.token()), frame(r)));
    }
  }

  /** A frame that is well formed or nearly so: edge-case entries, the payload WRITE needs. */
  private byte[] frame(Random r) {
    boolean write = r.nextInt(4) != 0;
    byte op = r.nextInt(20) == 0 ? (byte) r.nextInt(256) : write ? TcpWire.OP_WRITE : TcpWire.OP_READ;
    int region = r.nextInt(10) == 0 ? r.nextInt() : target.id();
    int count = 1 + r.nextInt(r.nextBoolean() ? 4 : 64);
    int declared = r.nextInt(20) == 0 ? pick(r, 0, -1, TcpWire.MAX_ENTRIES + 1, Integer.MAX_VALUE) : count;
    ByteBuffer b = ByteBuffer.allocate(TcpWire.FRAME_HEADER_BYTES + count * TcpWire.ENTRY_BYTES);
    b.put(op).putInt(region).putInt(declared);
    long payload = 0;
    for (int e = 0; e < count; e++) {
      long offset = edge(r, LENGTH);
      long length = edge(r, LENGTH);
      b.putLong(offset).putLong(length);
      if (op == TcpWire.OP_WRITE && length > 0 && length <= LENGTH) {
        payload += length;
      }
    }
    byte[] header = b.array();
    if (op != TcpWire.OP_WRITE) {
      return header;
    }
    // Usually the whole payload, sometimes short of it.
    int n = (int) Math.min(payload, 4L * LENGTH);
    if (r.nextInt(5) == 0) {
      n = r.nextInt(n + 1);
    }
    return concat(header, randomBytes(r, n));
  }

  /** Offsets and lengths near the interesting edges of a region of {@code length} bytes. */
  private static long edge(Random r, long length) {
    switch (r.nextInt(8)) {
      case 0:
        return r.nextLong();
      case 1:
        return pickLong(r, 0, -1, Long.MAX_VALUE, Long.MIN_VALUE, TcpWire.MAX_ENTRY_BYTES + 1);
      case 2:
        return length + r.nextInt(3) - 1;
      case 3:
        return length - r.nextInt(PAGE);
      default:
        return r.nextInt((int) length / 4 + 1);
    }
  }

  private static byte[] mutate(Random r, byte[] in) {
    byte[] out = in.clone();
    if (out.length == 0) {
      return out;
    }
    int flips = 1 + r.nextInt(4);
    for (int i = 0; i < flips; i++) {
      int at = r.nextInt(out.length);
      out[at] = r.nextBoolean() ? (byte) r.nextInt(256) : (byte) (out[at] ^ (1 << r.nextInt(8)));
    }
    return out;
  }

  private static byte[] cut(Random r, byte[] in) {
    return java.util.Arrays.copyOf(in, r.nextInt(in.length + 1));
  }

  private static byte[] hello(byte[] token) {
    return ByteBuffer.allocate(6 + token.length).putInt(TcpWire.MAGIC).put((byte) TcpWire.VERSION)
        .put((byte) token.length).put(token).array();
  }

  private static byte[] randomBytes(Random r, int n) {
    byte[] b = new byte[n];
    r.nextBytes(b);
    return b;
  }

  private static byte[] concat(byte[]... parts) {
    int n = 0;
    for (byte[] p : parts) {
      n += p.length;
    }
    ByteBuffer b = ByteBuffer.allocate(n);
    for (byte[] p : parts) {
      b.put(p);
    }
    return b.array();
  }

  private static int pick(Random r, int... values) {
    return values[r.nextInt(values.length)];
  }

  private static long pickLong(Random r, long... values) {
    return values[r.nextInt(values.length)];
  }

  private void assertGuardsIntact(int run) {
    for (long offset : new long[] {0, PAGE + (long) LENGTH}) {
      byte[] guard = Patterns.bytes(mapping, offset, PAGE);
      for (int i = 0; i < guard.length; i++) {
        if (guard[i] != GUARD) {
          throw new AssertionError("byte " + (offset + i - PAGE) + " relative to the region was "
              + "written (seed " + SEED + ", input " + run + ")");
        }
      }
    }
  }

  private void assertGoodClientStillSucceeds(int run) {
    MemoryRegion src = ours.allocateHost(PAGE);
    try {
      Patterns.fill(src, 0, PAGE, run);
      TransferBatch batch = new TransferBatch(new long[] {0}, new long[] {PAGE}, new long[] {PAGE});
      TransferStatus s = Patterns.await(goodClient.write(src, descriptor, batch));
      assertTrue(s.succeeded(), () -> "after " + run + " inputs (seed " + SEED + "): " + s);
      assertEquals(Patterns.crc(src, 0, PAGE), Patterns.crc(target, PAGE, PAGE));
      Patterns.fillConstant(src, (byte) 0);
      TransferStatus back = Patterns.await(goodClient.read(src, descriptor, batch));
      assertTrue(back.succeeded(), () -> "read after " + run + " inputs: " + back);
      assertEquals(Patterns.crc(target, PAGE, PAGE), Patterns.crc(src, 0, PAGE));
    } finally {
      src.close();
    }
  }
}
