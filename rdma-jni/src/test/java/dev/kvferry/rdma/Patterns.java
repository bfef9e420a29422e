package dev.kvferry.rdma;

import java.nio.ByteBuffer;
import java.time.Duration;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.zip.CRC32C;

/** Test data: deterministic byte patterns, checksums of region ranges, waiting on statuses. */
final class Patterns {
  private Patterns() {}

  /** The pattern byte at {@code position} for {@code seed}. */
  static byte at(long seed, long position) {
    long x = (position + 1) * 0x9E3779B97F4A7C15L + seed * 0xBF58476D1CE4E5B9L;
    return (byte) ((x ^ (x >>> 29)) >>> 24);
  }

  /** Fills {@code [offset, offset + length)} of a host region with the pattern of {@code seed}. */
  static void fill(MemoryRegion region, long offset, int length, long seed) {
    ByteBuffer b = region.buffer(offset, length);
    for (int i = 0; i < length; i++) {
      b.put(i, at(seed, offset + i));
    }
  }

  /** Fills a whole region with one byte value (guard bytes). */
  static void fillConstant(MemoryRegion region, byte value) {
    ByteBuffer b = region.buffer(0, (int) region.lengthBytes());
    for (int i = 0; i < b.capacity(); i++) {
      b.put(i, value);
    }
  }

  static long crc(MemoryRegion region, long offset, int length) {
    CRC32C crc = new CRC32C();
    crc.update(region.buffer(offset, length));
    return crc.getValue();
  }

  static byte[] bytes(MemoryRegion region, long offset, int length) {
    byte[] out = new byte[length];
    region.buffer(offset, length).get(out);
    return out;
  }

  /** Waits for a status to finish (a deadline against hangs, not a timing assertion). */
  static TransferStatus await(TransferStatus status) {
    try {
      return status.completion().get(Duration.ofSeconds(60).toSeconds(), TimeUnit.SECONDS);
    } catch (TimeoutException e) {
      throw new AssertionError("transfer still pending after 60 s: " + status);
    } catch (InterruptedException | ExecutionException e) {
      throw new AssertionError(e);
    }
  }
}
