package dev.kvferry.actors;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.NotSerializableException;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.util.Arrays;
import java.util.List;
import java.util.stream.IntStream;
import org.apache.pekko.actor.testkit.typed.javadsl.ActorTestKit;
import org.apache.pekko.serialization.SerializationExtension;
import org.apache.pekko.serialization.Serializer;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

class PeerMessageSerializerTest {
  private static ActorTestKit kit;
  private final PeerMessageSerializer serializer = new PeerMessageSerializer();

  @BeforeAll
  static void start() {
    kit = ActorTestKit.create();
  }

  @AfterAll
  static void stop() {
    kit.shutdownTestKit();
  }

  private static PeerProtocol.RemoteBlocks blocks(int[] ids, PeerProtocol.DoneWord doneWord) {
    return new PeerProtocol.RemoteBlocks("tx-1", "req-1", ids, "decode-0", 1, 3, doneWord);
  }

  /** Every message the serializer is bound to, with edge values. */
  private static List<Object> messages() {
    int[] large = IntStream.range(0, 200_000).map(i -> i * 7919 - 100_000).toArray();
    large[0] = Integer.MIN_VALUE;
    large[1] = Integer.MAX_VALUE;
    large[2] = -1;
    return List.of(
        blocks(new int[0], null),
        blocks(new int[] {0, 1, 63, 64, 8191, 8192, 1 << 20}, null),
        blocks(large, new PeerProtocol.DoneWord("kvferry-done-1234", 64, 63, Long.MIN_VALUE)),
        blocks(new int[] {-1}, new PeerProtocol.DoneWord("", 0, -1, -1L)),
        new PeerProtocol.RemoteBlocks("", "", new int[] {5}, "", -1, Integer.MAX_VALUE, null),
        new PeerProtocol.RemoteBlocks("tx-\u00e9\u4e2d\ud83d\ude80", "", new int[] {1}, "d", 0, 0),
        new PeerProtocol.WriteDone("tx-1", "prefill-0", 0),
        new PeerProtocol.WriteDone("", "", Integer.MIN_VALUE),
        new PeerProtocol.TransferFailed("tx-1", "decode-0", "x".repeat(100_000), 7),
        new PeerProtocol.TransferFailed("tx-1", "e", "", 0),
        new PeerProtocol.Release("tx-1", "decode-0", 1, 2),
        new PeerProtocol.Release("", "", -5, 0));
  }

  /** Records compare arrays by identity; the tests compare their contents. */
  private static void assertSameMessage(Object expected, Object actual) {
    assertEquals(expected.getClass(), actual.getClass());
    if (expected instanceof PeerProtocol.RemoteBlocks e) {
      PeerProtocol.RemoteBlocks a = (PeerProtocol.RemoteBlocks) actual;
      assertArrayEquals(e.blockIds(), a.blockIds());
      assertEquals(e, new PeerProtocol.RemoteBlocks(a.transferId(), a.requestId(), e.blockIds(),
          a.decodeEngineId(), a.decodeDpRank(), a.decodeTpRank(), a.doneWord()));
    } else {
      assertEquals(expected, actual);
    }
  }

  @Test
  void everyBoundMessageIsSerializedByThePeerSerializerNotJackson() throws Exception {
    var serialization = SerializationExtension.get(kit.system());
    for (Object m : messages()) {
      Serializer s = serialization.serializerFor(m.getClass());
      assertEquals(PeerMessageSerializer.IDENTIFIER, s.identifier(), m.getClass().getName());
    }
    Serializer handshake = serialization.serializerFor(PeerProtocol.MetadataReply.class);
    assertTrue(handshake.getClass().getName().contains("Jackson"), handshake.getClass().getName());
  }

  @Test
  void everyBoundMessageSurvivesTheByteArrayRoundTrip() throws Exception {
    for (Object m : messages()) {
      byte[] bytes = serializer.toBinary(m);
      assertEquals(PeerMessageSerializer.sizeBytes(m), bytes.length, m.getClass().getName());
      assertSameMessage(m, serializer.fromBinary(bytes, serializer.manifest(m)));
    }
  }

  @Test
  void everyBoundMessageSurvivesArterysBufferRoundTripAndLeavesItsByteOrderAlone()
      throws Exception {
    for (Object m : messages()) {
      ByteBuffer buf = ByteBuffer.allocateDirect(2 * 1024 * 1024).order(ByteOrder.BIG_ENDIAN);
      buf.putInt(0xCAFE); // Artery's header comes first; the serializer starts at position()
      int start = buf.position();
      serializer.toBinary(m, buf);
      assertEquals(ByteOrder.BIG_ENDIAN, buf.order());
      buf.limit(buf.position()).position(start);
      byte[] copy = new byte[buf.remaining()];
      buf.duplicate().get(copy);
      assertArrayEquals(serializer.toBinary(m), copy, "same bytes through either path");
      assertSameMessage(m, serializer.fromBinary(buf, serializer.manifest(m)));
      assertEquals(ByteOrder.BIG_ENDIAN, buf.order());
      assertEquals(buf.limit(), buf.position());
    }
  }

  @Test
  void aLoneSurrogateIsWrittenAsAQuestionMarkWithoutLeftoverBytes() throws Exception {
    var m = new PeerProtocol.WriteDone("tx-\ud800", "p", 0);
    var back = (PeerProtocol.WriteDone) serializer.fromBinary(serializer.toBinary(m), "WD1");
    assertEquals("tx-?", back.transferId());
  }

  @Test
  void everyTruncationOfEveryMessageIsRejectedWithTheManifestAndOffset() {
    for (Object m : messages()) {
      byte[] bytes = serializer.toBinary(m);
      String manifest = serializer.manifest(m);
      // Every cut for small messages; a sample of cuts for the large ones.
      int step = Math.max(1, bytes.length / 500);
      for (int cut = 0; cut < bytes.length; cut += step) {
        byte[] shorter = Arrays.copyOf(bytes, cut);
        var e = assertThrows(NotSerializableException.class,
            () -> serializer.fromBinary(shorter, manifest), manifest + " cut at " + cut);
        assertTrue(e.getMessage().contains("'" + manifest + "'"), e.getMessage());
        assertTrue(e.getMessage().contains(" of " + cut), e.getMessage());
      }
    }
  }

  @Test
  void bytesLeftOverAfterTheMessageAreRejected() {
    byte[] bytes = serializer.toBinary(new PeerProtocol.WriteDone("tx-1", "p", 0));
    byte[] longer = Arrays.copyOf(bytes, bytes.length + 3);
    var e = assertThrows(NotSerializableException.class, () -> serializer.fromBinary(longer, "WD1"));
    assertEquals("kvferry peer message with manifest 'WD1': 3 bytes left over after the message ("
        + bytes.length + " bytes); the sender may run another kvferry version", e.getMessage());
  }

  @Test
  void anUnknownManifestNamesTheOnesThisNodeReads() {
    var e = assertThrows(NotSerializableException.class,
        () -> serializer.fromBinary(new byte[8], "RB3"));
    assertEquals("kvferry peer message with manifest 'RB3': unknown to this node (it reads RB2, "
        + "RB1, WD1, TF1, RL1); the sender may run another kvferry version; the message is dropped",
        e.getMessage());
  }

  /** A node of the version before sends RB1: no incarnation uid, read as "any". */
  @Test
  void remoteBlocksOfTheVersionBeforeAreStillRead() throws Exception {
    PeerProtocol.RemoteBlocks m = blocks(new int[] {3, 1}, null);
    byte[] v2 = serializer.toBinary(m);
    assertEquals("RB2", serializer.manifest(m));
    byte[] v1 = Arrays.copyOf(v2, v2.length - 4); // RB1 is RB2 without the trailing uid
    var read = (PeerProtocol.RemoteBlocks) serializer.fromBinary(v1, "RB1");
    assertEquals(0, read.decodeWorkerUid());
    assertArrayEquals(new int[] {3, 1}, read.blockIds());
    var pinned = new PeerProtocol.RemoteBlocks("tx", "r", new int[] {2}, "d", 0, 1, null, -42);
    assertEquals(-42, ((PeerProtocol.RemoteBlocks) serializer.fromBinary(
        serializer.toBinary(pinned), "RB2")).decodeWorkerUid());
  }

  @Test
  void aBlockCountPastTheBytesLeftIsRejectedBeforeAnythingIsAllocated() {
    ByteBuffer buf = ByteBuffer.allocate(16).order(ByteOrder.LITTLE_ENDIAN);
    buf.putInt(0).putInt(0).putInt(Integer.MAX_VALUE).putInt(0);
    var e = assertThrows(NotSerializableException.class,
        () -> serializer.fromBinary(buf.array(), "RB1"));
    assertEquals("kvferry peer message with manifest 'RB1': a list of 2147483647 block ids, with 4"
        + " bytes left at byte 8 of 16; the message is dropped", e.getMessage());
  }

  @Test
  void aNegativeOrOverlongStringLengthIsRejected() {
    for (int length : new int[] {-1, Integer.MIN_VALUE, 5, Integer.MAX_VALUE}) {
      ByteBuffer buf = ByteBuffer.allocate(8).order(ByteOrder.LITTLE_ENDIAN);
      buf.putInt(length).putInt(0);
      var e = assertThrows(NotSerializableException.class,
          () -> serializer.fromBinary(buf.array(), "WD1"));
      assertEquals("kvferry peer message with manifest 'WD1': a string of " + length
          + " bytes, with 4 bytes left at byte 0 of 8; the message is dropped", e.getMessage());
    }
  }

  @Test
  void aBlockIdLongerThanFiveBytesIsRejected() {
    ByteBuffer buf = ByteBuffer.allocate(32).order(ByteOrder.LITTLE_ENDIAN);
    buf.putInt(0).putInt(0).putInt(1);
    for (int i = 0; i < 6; i++) {
      buf.put((byte) 0x80);
    }
    var e = assertThrows(NotSerializableException.class,
        () -> serializer.fromBinary(Arrays.copyOf(buf.array(), buf.position()), "RB1"));
    assertTrue(e.getMessage().contains("block id 0 is longer than 5 bytes"), e.getMessage());
  }

  @Test
  void aDoneWordFlagOtherThanZeroOrOneIsRejected() throws Exception {
    byte[] v2 = serializer.toBinary(blocks(new int[] {1}, null));
    byte[] bytes = Arrays.copyOf(v2, v2.length - 4); // RB1: the flag is the last byte
    bytes[bytes.length - 1] = 7;
    var e = assertThrows(NotSerializableException.class,
        () -> serializer.fromBinary(bytes, "RB1"));
    assertEquals("kvferry peer message with manifest 'RB1': done-word flag is 7, not 0 or 1 at byte "
        + (bytes.length - 1) + " of " + bytes.length + "; the message is dropped", e.getMessage());
  }

  @Test
  void randomBytesNeverEscapeAsAnythingButNotSerializable() {
    var random = new java.util.Random(19);
    for (String manifest : List.of("RB1", "WD1", "TF1", "RL1")) {
      for (int i = 0; i < 5_000; i++) {
        byte[] bytes = new byte[random.nextInt(64)];
        random.nextBytes(bytes);
        try {
          Object m = serializer.fromBinary(bytes, manifest);
          assertSame(serializer.manifest(m), serializer.manifest(m));
        } catch (NotSerializableException expected) {
          // the only failure a peer's bytes may cause
        }
      }
    }
  }

  @Test
  void aMessageItDoesNotHandleIsNamed() {
    var e = assertThrows(IllegalArgumentException.class, () -> serializer.manifest("text"));
    assertTrue(e.getMessage().contains("java.lang.String"), e.getMessage());
  }
}
