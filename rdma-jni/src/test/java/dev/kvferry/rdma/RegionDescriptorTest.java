package dev.kvferry.rdma;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.Arrays;
import net.jqwik.api.Arbitraries;
import net.jqwik.api.Arbitrary;
import net.jqwik.api.Combinators;
import net.jqwik.api.Example;
import net.jqwik.api.ForAll;
import net.jqwik.api.Property;
import net.jqwik.api.Provide;
import net.jqwik.api.constraints.Size;
import org.msgpack.core.MessageBufferPacker;
import org.msgpack.core.MessagePack;

/** Descriptors cross the network: exact round trips, and any bad bytes give one checked exception. */
class RegionDescriptorTest {

  @Provide
  Arbitrary<RegionDescriptor> descriptors() {
    Arbitrary<String> text =
        Arbitraries.strings()
            .withCharRange('\u0000', '\uD7FF')
            .withCharRange('\uE000', '\uFFFD')
            .ofMaxLength(60);
    Arbitrary<byte[]> secret = Arbitraries.bytes().array(byte[].class).ofMaxSize(256);
    Arbitrary<RegionDescriptor> numbers =
        Combinators.combine(
                Arbitraries.integers(),
                Arbitraries.longs().greaterOrEqual(0),
                Arbitraries.of(RegionKind.class),
                Arbitraries.integers(),
                Arbitraries.longs(),
                Arbitraries.longs(),
                Arbitraries.integers().between(0, 65535))
            .as((id, length, kind, device, pid, base, port) ->
                new RegionDescriptor(id, length, kind, device, "", pid, base, "", "", port, null, null));
    return Combinators.combine(numbers, text, text, text, secret, secret,
            Arbitraries.integers().between(-1, 1 << 20), Arbitraries.longs())
        .as((n, owner, bootId, host, token, handle, fd, inode) ->
            new RegionDescriptor(n.regionId(), n.lengthBytes(), n.kind(), n.device(), owner, n.pid(),
                n.baseAddress(), bootId, host, n.tcpPort(), token, handle)
                .withSharedPages(fd < 0 ? null : new SharedPages(fd, inode >>> 7, inode)));
  }

  @Example
  void sharedPagesMissingAPartAreMalformed() throws Exception {
    try (MessageBufferPacker p = MessagePack.newDefaultBufferPacker()) {
      p.packMapHeader(5);
      p.packString("region_id").packInt(1);
      p.packString("length").packLong(4096);
      p.packString("kind").packString("HOST");
      p.packString("shm_fd").packInt(7);
      p.packString("shm_ino").packLong(99);
      MalformedDescriptorException e = assertThrows(MalformedDescriptorException.class,
          () -> RegionDescriptor.unpack(p.toByteArray()));
      assertTrue(e.getMessage().contains("shm_dev"), e.getMessage());
    }
  }

  @Property(tries = 200)
  void packThenUnpackGivesTheSameDescriptor(@ForAll("descriptors") RegionDescriptor d)
      throws MalformedDescriptorException {
    byte[] packed = d.pack();
    RegionDescriptor back = RegionDescriptor.unpack(packed);
    assertEquals(d, back);
    assertEquals(d.owner(), back.owner());
    assertEquals(d.bootId(), back.bootId());
    assertArrayEquals(d.token(), back.token());
    assertArrayEquals(d.cudaIpcHandle(), back.cudaIpcHandle());
    assertArrayEquals(packed, back.pack());
  }

  @Property(tries = 200)
  void everyTruncationIsMalformed(
      @ForAll("descriptors") RegionDescriptor d, @ForAll double where) {
    byte[] packed = d.pack();
    int cut = (int) (Math.abs(where) % 1.0 * packed.length); // 0 .. length - 1
    byte[] truncated = Arrays.copyOf(packed, cut);
    assertThrows(MalformedDescriptorException.class, () -> RegionDescriptor.unpack(truncated));
  }

  @Property(tries = 500)
  void garbageIsMalformedAndNothingElse(@ForAll @Size(max = 1200) byte[] garbage) {
    unpackOrMalformed(garbage);
  }

  @Property(tries = 400)
  void corruptedDescriptorsAreMalformedAndNothingElse(
      @ForAll("descriptors") RegionDescriptor d, @ForAll int position, @ForAll byte value) {
    byte[] packed = d.pack();
    packed[Math.floorMod(position, packed.length)] = value;
    unpackOrMalformed(packed);
  }

  @Example
  void wrongTypesAndMissingFieldsAreMalformed() throws Exception {
    MessageBufferPacker p = MessagePack.newDefaultBufferPacker();
    p.packMapHeader(3);
    p.packString("region_id").packString("seven");
    p.packString("length").packLong(10);
    p.packString("kind").packString("HOST");
    byte[] wrongType = p.toByteArray();
    MalformedDescriptorException e =
        assertThrows(MalformedDescriptorException.class, () -> RegionDescriptor.unpack(wrongType));
    assertTrue(e.getMessage().startsWith("malformed region descriptor"), e.getMessage());

    p = MessagePack.newDefaultBufferPacker();
    p.packMapHeader(1);
    p.packString("length").packLong(10);
    byte[] missing = p.toByteArray();
    e = assertThrows(MalformedDescriptorException.class, () -> RegionDescriptor.unpack(missing));
    assertTrue(e.getMessage().contains("lacks a required field"), e.getMessage());

    assertThrows(MalformedDescriptorException.class, () -> RegionDescriptor.unpack(new byte[0]));
    assertThrows(MalformedDescriptorException.class, () -> RegionDescriptor.unpack(null));
    assertThrows(
        MalformedDescriptorException.class,
        () -> RegionDescriptor.unpack(new byte[RegionDescriptor.MAX_PACKED_BYTES + 1]));
  }

  @Example
  void packingAnOversizedDescriptorFailsAtTheProducer() {
    RegionDescriptor huge =
        new RegionDescriptor(1, 10, RegionKind.HOST, -1, "x".repeat(5000), 1, 1, "", "", 0, null, null);
    IllegalArgumentException e = assertThrows(IllegalArgumentException.class, huge::pack);
    assertTrue(e.getMessage().contains("packs to"), e.getMessage());
  }

  @Example
  void theTokenNeverAppearsInToString() {
    byte[] token = "sekrit-token-123".getBytes(java.nio.charset.StandardCharsets.US_ASCII);
    RegionDescriptor d =
        new RegionDescriptor(1, 10, RegionKind.HOST, -1, "D0", 1, 1, "b", "h", 7, token, null);
    assertTrue(!d.toString().contains("sekrit"), d.toString());
  }

  @Example
  void ucxFieldsRoundTripAndDescriptorsWithoutThemKeepTheirOldForm() throws Exception {
    RegionDescriptor plain =
        new RegionDescriptor(3, 4096, RegionKind.HOST, -1, "D0", 42, 0x1000, "b", "h", 7, null, null);
    byte[] oldForm = plain.pack();
    // Without UCX fields the map keeps its 12 entries: peers from before the ucx transport read it.
    assertEquals((byte) 0x8c, oldForm[0]);
    RegionDescriptor fromOld = RegionDescriptor.unpack(oldForm);
    assertEquals(0, fromOld.ucxWorkerAddress().length);
    assertEquals(0, fromOld.ucxRkey().length);

    byte[] address = new byte[900];
    byte[] rkey = new byte[40];
    java.util.Arrays.fill(address, (byte) 7);
    java.util.Arrays.fill(rkey, (byte) 9);
    RegionDescriptor ucx = plain.withUcx(address, rkey);
    RegionDescriptor back = RegionDescriptor.unpack(ucx.pack());
    assertEquals(ucx, back);
    assertArrayEquals(address, back.ucxWorkerAddress());
    assertArrayEquals(rkey, back.ucxRkey());
    assertTrue(ucx.toString().contains("ucx worker address of 900 bytes"), ucx.toString());

    RegionDescriptor oversized = plain.withUcx(new byte[RegionDescriptor.MAX_UCX_BYTES + 1], rkey);
    IllegalArgumentException e = assertThrows(IllegalArgumentException.class, oversized::pack);
    assertTrue(e.getMessage().contains("UCX worker address or remote key over"), e.getMessage());
  }

  private static void unpackOrMalformed(byte[] bytes) {
    try {
      RegionDescriptor.unpack(bytes);
    } catch (MalformedDescriptorException expected) {
      // the one allowed failure
    } catch (Throwable other) {
      throw new AssertionError("unpack threw " + other + " instead of MalformedDescriptorException", other);
    }
  }
}
