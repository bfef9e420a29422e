package dev.kvferry.actors.engine;

import static org.junit.jupiter.api.Assertions.assertDoesNotThrow;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;

import dev.kvferry.actors.plan.KvCacheGeometry;
import dev.kvferry.rdma.LocalTransport;
import dev.kvferry.rdma.RegionDescriptor;
import dev.kvferry.rdma.RegionRegistry;
import java.util.ArrayList;
import java.util.List;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;

/** What the handshake accepts between differently shaped P and D, and how it refuses the rest. */
class AgentMetadataCompatibilityTest {

  private final RegionRegistry registry = new RegionRegistry("test");
  private final LocalTransport transport = new LocalTransport(registry);

  @AfterEach
  void close() {
    registry.close();
  }

  private AgentMetadata meta(String engine, int tpRank, int tpSize, KvCacheGeometry g, int layers) {
    List<RegionDescriptor> d = new ArrayList<>();
    for (int l = 0; l < layers; l++) {
      d.add(transport.describe(registry.allocateHost(g.layerRegionBytes())));
    }
    return new AgentMetadata(engine, 0, tpRank, tpSize, "local", g, d);
  }

  private String refusal(AgentMetadata a, AgentMetadata b) {
    return assertThrows(HandshakeException.class, () -> a.checkCompatibleWith(b)).getMessage();
  }

  @Test
  void acceptsDifferentBlockSizesNumBlocksAndTpSizesWithTheSameTotalHeads() throws Exception {
    AgentMetadata p = meta("p", 1, 2, KvCacheGeometry.standard(8, 16, 2, 8, 2), 2);
    AgentMetadata d = meta("d", 0, 1, KvCacheGeometry.standard(6, 32, 4, 8, 2), 2);
    assertDoesNotThrow(() -> p.checkCompatibleWith(d));
    assertDoesNotThrow(() -> d.checkCompatibleWith(p));
    AgentMetadata back = AgentMetadata.unpack(p.pack());
    assertEquals(4, back.totalKvHeads());
    assertEquals(2, back.headOffset());
  }

  @Test
  void refusesDifferentHeadDimNamingBothSides() {
    assertEquals("incompatible KV caches: head_dim is 8 on p/tp0 but 16 on d/tp0",
        refusal(meta("p", 0, 1, KvCacheGeometry.standard(8, 16, 4, 8, 2), 2),
            meta("d", 0, 1, KvCacheGeometry.standard(8, 16, 4, 16, 2), 2)));
  }

  @Test
  void refusesDifferentDtypeNamingBothSides() {
    assertEquals("incompatible KV caches: elem_size (dtype bytes) is 2 on p/tp0 but 4 on d/tp0",
        refusal(meta("p", 0, 1, KvCacheGeometry.standard(8, 16, 4, 8, 2), 2),
            meta("d", 0, 1, KvCacheGeometry.standard(8, 16, 4, 8, 4), 2)));
  }

  @Test
  void refusesDifferentLayerCountNamingBothSides() {
    assertEquals("incompatible KV caches: layer count is 2 on p/tp0 but 3 on d/tp0",
        refusal(meta("p", 0, 1, KvCacheGeometry.standard(8, 16, 4, 8, 2), 2),
            meta("d", 0, 1, KvCacheGeometry.standard(8, 16, 4, 8, 2), 3)));
  }

  @Test
  void refusesDifferentLayoutNamingBothSides() {
    assertEquals("incompatible KV caches: layout is STANDARD on p/tp0 but MLA on d/tp0",
        refusal(meta("p", 0, 1, KvCacheGeometry.standard(8, 16, 4, 8, 2), 2),
            meta("d", 0, 1, KvCacheGeometry.mla(8, 16, 32, 2), 2)));
  }

  @Test
  void acceptsAStandardPeerOfABlocksFirstCacheAndRefusesAnMlaOne() throws Exception {
    AgentMetadata blocksFirst = meta("d", 0, 1, KvCacheGeometry.blocksFirst(6, 16, 4, 8, 2), 2);
    AgentMetadata back = AgentMetadata.unpack(blocksFirst.pack());
    assertEquals(blocksFirst.geometry(), back.geometry());
    assertDoesNotThrow(() -> meta("p", 0, 1, KvCacheGeometry.standard(8, 16, 4, 8, 2), 2)
        .checkCompatibleWith(back));
    assertEquals("incompatible KV caches: layout is MLA on p/tp0 but BLOCKS_FIRST on d/tp0",
        refusal(meta("p", 0, 1, KvCacheGeometry.mla(8, 16, 32, 2), 2), back));
  }

  @Test
  void blocksFirstMetadataNamesZeroKvHeadsWhereAReaderFromBeforeItLooks() throws Exception {
    // Such a reader took any layout but MLA as STANDARD; it builds its peer's geometry from
    // kv_heads, and 0 heads fails that, so it refuses the handshake instead of planning
    // [2, N, ...] offsets into [N, 2, ...] blocks.
    byte[] blob = meta("d", 0, 1, KvCacheGeometry.blocksFirst(6, 16, 4, 8, 2), 2).pack();
    int kvHeads = -1;
    try (org.msgpack.core.MessageUnpacker u = org.msgpack.core.MessagePack.newDefaultUnpacker(blob)) {
      int n = u.unpackMapHeader();
      for (int i = 0; i < n; i++) {
        if (u.unpackString().equals("kv_heads")) {
          kvHeads = u.unpackInt();
        } else {
          u.skipValue();
        }
      }
    }
    assertEquals(0, kvHeads);
    int heads = kvHeads;
    assertThrows(IllegalArgumentException.class,
        () -> KvCacheGeometry.standard(6, 16, heads, 8, 2));
    assertEquals(4, AgentMetadata.unpack(blob).geometry().kvHeads());
  }

  @Test
  void refusesDifferentLatentNamingBothSides() {
    assertEquals("incompatible KV caches: latent is 32 on p/tp0 but 64 on d/tp0",
        refusal(meta("p", 0, 1, KvCacheGeometry.mla(8, 16, 32, 2), 2),
            meta("d", 0, 1, KvCacheGeometry.mla(8, 32, 64, 2), 2)));
  }

  @Test
  void refusesDifferentTotalHeadsNamingBothSides() {
    assertEquals("incompatible KV caches: total KV heads (kv_heads x tp_size) is 2 x 2 = 4 on"
        + " p/tp1 but 2 x 1 = 2 on d/tp0",
        refusal(meta("p", 1, 2, KvCacheGeometry.standard(8, 16, 2, 8, 2), 2),
            meta("d", 0, 1, KvCacheGeometry.standard(8, 16, 2, 8, 2), 2)));
  }

  @Test
  void aPeerWhoseHeadsTimesTpSizeOverflowsIsRefusedAtTheHandshake() throws Exception {
    // 2^29 heads x 8 ranks is 2^32: in int arithmetic 0, which could pass as "same total heads".
    var out = new java.io.ByteArrayOutputStream();
    try (var p = org.msgpack.core.MessagePack.newDefaultPacker(out)) {
      p.packMapHeader(11);
      p.packString("engine_id").packString("prefill-0");
      p.packString("dp_rank").packInt(0);
      p.packString("tp_rank").packInt(0);
      p.packString("tp_size").packInt(8);
      p.packString("layout").packString("STANDARD");
      p.packString("num_blocks").packInt(1);
      p.packString("block_size").packInt(1);
      p.packString("kv_heads").packInt(1 << 29);
      p.packString("head_dim").packInt(1);
      p.packString("elem_size").packInt(1);
      p.packString("layer_descriptors").packArrayHeader(0);
    }
    String why =
        assertThrows(HandshakeException.class, () -> AgentMetadata.unpack(out.toByteArray()))
            .getMessage();
    org.junit.jupiter.api.Assertions.assertTrue(why.contains("overflows"), why);
  }
}
