package dev.kvferry.actors.engine;

import static org.junit.jupiter.api.Assertions.assertTimeoutPreemptively;

import dev.kvferry.actors.plan.KvCacheGeometry;
import dev.kvferry.rdma.MalformedDescriptorException;
import dev.kvferry.rdma.RegionDescriptor;
import dev.kvferry.rdma.RegionKind;
import java.io.IOException;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HexFormat;
import java.util.List;
import java.util.Random;
import org.junit.jupiter.api.Test;
import org.msgpack.core.MessageBufferPacker;
import org.msgpack.core.MessagePack;

/**
 * Fuzzes the two msgpack decoders that read what peers send in the handshake: {@link
 * RegionDescriptor#unpack} and {@link AgentMetadata#unpack}. Inputs are random bytes, valid blobs
 * with bytes flipped, inserted or cut, and msgpack maps with the real field names holding values of
 * random types and headers that claim far more than follows. Only the declared checked exception
 * may escape, and no input may hang the decoder.
 *
 * <p>Runs {@code kvferry.fuzz.seconds} seconds per decoder (default 3, for CI); set it higher to
 * fuzz longer, and {@code kvferry.fuzz.seed} to replay a reported failure.
 */
class MetadataDecoderFuzzTest {

  private static final Duration BUDGET =
      Duration.ofMillis((long) (Double.parseDouble(System.getProperty("kvferry.fuzz.seconds", "3")) * 1000));
  private static final long SEED =
      Long.getLong("kvferry.fuzz.seed", new Random().nextLong());

  private static final String[] DESCRIPTOR_KEYS = {
    "region_id", "length", "kind", "device", "owner", "pid", "base_addr", "boot_id", "tcp_host",
    "tcp_port", "token", "cuda_ipc_handle"
  };
  private static final String[] METADATA_KEYS = {
    "engine_id", "dp_rank", "tp_rank", "tp_size", "transport", "attn_backend_name", "layout",
    "num_blocks", "block_size", "kv_heads", "head_dim", "latent", "elem_size", "block_len",
    "kv_caches_base_addr", "layer_descriptors"
  };

  private interface Decoder {
    void decode(byte[] blob) throws Exception;
  }

  private static RegionDescriptor descriptor(Random r) {
    byte[] token = new byte[r.nextInt(33)];
    r.nextBytes(token);
    return new RegionDescriptor(r.nextInt(100), r.nextInt(1 << 20), RegionKind.HOST, -1,
        "engine-" + r.nextInt(9), r.nextInt(1 << 16), r.nextLong(), "boot", "127.0.0.1",
        r.nextInt(65536), token, null);
  }

  private static byte[] validMetadata(Random r) {
    List<RegionDescriptor> layers = new ArrayList<>();
    for (int i = 0, n = 1 + r.nextInt(4); i < n; i++) {
      layers.add(descriptor(r));
    }
    KvCacheGeometry g = r.nextBoolean()
        ? KvCacheGeometry.standard(1 + r.nextInt(64), 16, 8, 128, 2)
        : KvCacheGeometry.mla(1 + r.nextInt(64), 16, 576, 2);
    return new AgentMetadata("prefill-" + r.nextInt(9), 0, 0, 1, "tcp", g, layers).pack();
  }

  @Test
  void regionDescriptorUnpackThrowsOnlyMalformedDescriptorException() {
    fuzz("RegionDescriptor.unpack", r -> descriptor(r).pack(), DESCRIPTOR_KEYS, blob -> {
      try {
        RegionDescriptor.unpack(blob);
      } catch (MalformedDescriptorException expected) {
        // the one way to refuse
      }
    });
  }

  @Test
  void agentMetadataUnpackThrowsOnlyHandshakeException() {
    fuzz("AgentMetadata.unpack", MetadataDecoderFuzzTest::validMetadata, METADATA_KEYS, blob -> {
      try {
        AgentMetadata.unpack(blob);
      } catch (HandshakeException expected) {
        // the one way to refuse
      }
    });
  }

  private static void fuzz(String name, java.util.function.Function<Random, byte[]> valid, String[] keys,
      Decoder decoder) {
    Random r = new Random(SEED);
    long[] runs = {0};
    assertTimeoutPreemptively(BUDGET.plusSeconds(30), () -> {
      long end = System.nanoTime() + BUDGET.toNanos();
      while (System.nanoTime() < end) {
        byte[] input = switch (r.nextInt(4)) {
          case 0 -> randomBytes(r);
          case 1 -> mutate(r, valid.apply(r));
          case 2 -> truncate(r, valid.apply(r));
          default -> structured(r, keys);
        };
        try {
          decoder.decode(input);
        } catch (Throwable t) {
          throw new AssertionError(name + " threw " + t + " (seed " + SEED + ", run " + runs[0]
              + ") on " + HexFormat.of().formatHex(input), t);
        }
        runs[0]++;
      }
    }, () -> name + " hung (seed " + SEED + ", run " + runs[0] + ")");
    System.out.printf("%s: %d inputs in %d ms, seed %d%n", name, runs[0], BUDGET.toMillis(), SEED);
  }

  private static byte[] randomBytes(Random r) {
    byte[] b = new byte[r.nextInt(300)];
    r.nextBytes(b);
    return b;
  }

  private static byte[] truncate(Random r, byte[] valid) {
    return java.util.Arrays.copyOf(valid, r.nextInt(valid.length + 1));
  }

  private static byte[] mutate(Random r, byte[] valid) {
    byte[] b = valid.clone();
    for (int i = 0, n = 1 + r.nextInt(8); i < n; i++) {
      int at = r.nextInt(b.length);
      switch (r.nextInt(4)) {
        case 0 -> b[at] ^= (byte) (1 << r.nextInt(8));
        case 1 -> b[at] = (byte) r.nextInt(256);
        case 2 -> b[at] = (byte) (r.nextBoolean() ? 0xff : 0xdd); // -1 or a 32-bit array header
        default -> {
          byte[] shorter = new byte[b.length - 1];
          System.arraycopy(b, 0, shorter, 0, at);
          System.arraycopy(b, at + 1, shorter, at, b.length - at - 1);
          b = shorter.length == 0 ? new byte[] {0} : shorter;
        }
      }
    }
    return b;
  }

  /** A map with the decoder's own field names (and some others) holding random values. */
  private static byte[] structured(Random r, String[] keys) {
    try (MessageBufferPacker p = MessagePack.newDefaultBufferPacker()) {
      int entries = r.nextInt(20);
      // Sometimes the header claims more entries than follow.
      p.packMapHeader(r.nextInt(10) == 0 ? entries + 1 + r.nextInt(1 << 20) : entries);
      for (int i = 0; i < entries; i++) {
        if (r.nextInt(8) == 0) {
          value(r, p, 2); // a key that is not even a string
        } else {
          p.packString(r.nextInt(6) == 0 ? "x" + r.nextInt(5) : keys[r.nextInt(keys.length)]);
        }
        value(r, p, 3);
      }
      return p.toByteArray();
    } catch (IOException e) {
      throw new IllegalStateException(e);
    }
  }

  private static void value(Random r, MessageBufferPacker p, int depth) throws IOException {
    switch (r.nextInt(depth > 0 ? 12 : 9)) {
      case 0 -> p.packNil();
      case 1 -> p.packBoolean(r.nextBoolean());
      case 2 -> p.packInt(r.nextInt());
      case 3 -> p.packLong(r.nextLong());
      case 4 -> p.packInt(r.nextInt(200) - 100);
      case 5 -> p.packDouble(r.nextDouble());
      case 6 -> p.packString(r.nextBoolean() ? "HOST" : "s" + r.nextInt());
      case 7 -> {
        byte[] b = new byte[r.nextInt(80)];
        r.nextBytes(b);
        p.packBinaryHeader(b.length).writePayload(b);
      }
      case 8 -> p.packBinaryHeader(r.nextBoolean() ? Integer.MAX_VALUE : 1 << 20); // lies
      case 9 -> p.packArrayHeader(r.nextBoolean() ? Integer.MAX_VALUE : 5000); // lies
      case 10 -> {
        int n = r.nextInt(5);
        p.packArrayHeader(n);
        for (int i = 0; i < n; i++) {
          if (r.nextBoolean()) {
            byte[] d = descriptor(r).pack();
            p.packBinaryHeader(d.length).writePayload(d);
          } else {
            value(r, p, depth - 1);
          }
        }
      }
      default -> {
        int n = r.nextInt(4);
        p.packMapHeader(n);
        for (int i = 0; i < n; i++) {
          value(r, p, depth - 1);
          value(r, p, depth - 1);
        }
      }
    }
  }
}
