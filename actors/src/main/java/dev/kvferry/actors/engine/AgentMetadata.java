package dev.kvferry.actors.engine;

import dev.kvferry.actors.plan.KvCacheGeometry;
import dev.kvferry.rdma.MalformedDescriptorException;
import dev.kvferry.rdma.RegionDescriptor;
import java.io.IOException;
import java.util.ArrayList;
import java.util.List;
import org.msgpack.core.MessageBufferPacker;
import org.msgpack.core.MessagePack;
import org.msgpack.core.MessageUnpacker;

/**
 * What one engine worker serves in the handshake: its KV cache geometry and one region descriptor
 * per layer. Packed with msgpack using the seed's field names (engine_id, kv_caches_base_addr,
 * num_blocks, block_len, attn_backend_name) plus kvferry's own.
 */
public record AgentMetadata(
    String engineId,
    int dpRank,
    int tpRank,
    int tpSize,
    String transport,
    KvCacheGeometry geometry,
    List<RegionDescriptor> layers) {

  /** Upper bound on a packed blob; a larger one is refused unread. */
  public static final int MAX_PACKED_BYTES = 4 << 20;

  public AgentMetadata {
    layers = List.copyOf(layers);
  }

  public byte[] pack() {
    try (MessageBufferPacker p = MessagePack.newDefaultBufferPacker()) {
      boolean blocksFirst = geometry.layout() == KvCacheGeometry.Layout.BLOCKS_FIRST;
      p.packMapHeader(blocksFirst ? 19 : 18);
      p.packString("engine_id").packString(engineId);
      p.packString("dp_rank").packInt(dpRank);
      p.packString("tp_rank").packInt(tpRank);
      p.packString("tp_size").packInt(tpSize);
      p.packString("transport").packString(transport);
      p.packString("attn_backend_name").packString("kvferry-" + geometry.layout().name());
      p.packString("layout").packString(geometry.layout().name());
      p.packString("num_blocks").packInt(geometry.numBlocks());
      p.packString("block_size").packInt(geometry.blockSize());
      // A reader from before BLOCKS_FIRST takes any layout but MLA as STANDARD and would plan
      // [2, N, ...] offsets into [N, 2, ...] blocks: kv_heads 0 makes it refuse the handshake.
      p.packString("kv_heads").packInt(blocksFirst ? 0 : geometry.kvHeads());
      if (blocksFirst) {
        p.packString("blocks_first_kv_heads").packInt(geometry.kvHeads());
      }
      p.packString("total_kv_heads").packInt(totalKvHeads());
      p.packString("head_offset").packInt(headOffset());
      p.packString("head_dim").packInt(geometry.headDim());
      p.packString("latent").packInt(geometry.latent());
      p.packString("elem_size").packInt(geometry.elementBytes());
      p.packString("block_len").packLong(geometry.blockBytes());
      p.packString("kv_caches_base_addr").packArrayHeader(layers.size());
      for (RegionDescriptor d : layers) {
        p.packLong(d.baseAddress());
      }
      p.packString("layer_descriptors").packArrayHeader(layers.size());
      for (RegionDescriptor d : layers) {
        byte[] b = d.pack();
        p.packBinaryHeader(b.length).writePayload(b);
      }
      return p.toByteArray();
    } catch (IOException e) {
      throw new IllegalStateException("packing agent metadata of " + engineId, e);
    }
  }

  /**
   * Reads a blob from a peer.
   *
   * @throws HandshakeException when it is not valid metadata; never anything else
   */
  public static AgentMetadata unpack(byte[] blob) throws HandshakeException {
    if (blob == null || blob.length == 0 || blob.length > MAX_PACKED_BYTES) {
      throw new HandshakeException(
          "agent metadata of " + (blob == null ? 0 : blob.length) + " bytes refused");
    }
    String engineId = null;
    int dp = -1;
    int tp = -1;
    int tpSize = -1;
    String transport = "";
    String layout = null;
    int numBlocks = -1;
    int blockSize = -1;
    int kvHeads = 0;
    int blocksFirstKvHeads = 0;
    int totalKvHeads = -1;
    int headOffset = -1;
    int headDim = 0;
    int latent = 0;
    int elem = -1;
    List<RegionDescriptor> layers = null;
    try (MessageUnpacker u = MessagePack.newDefaultUnpacker(blob)) {
      int n = u.unpackMapHeader();
      if (n > 64) {
        throw new HandshakeException("agent metadata claims " + n + " fields");
      }
      for (int i = 0; i < n; i++) {
        String key = u.unpackString();
        switch (key) {
          case "engine_id" -> engineId = u.unpackString();
          case "dp_rank" -> dp = u.unpackInt();
          case "tp_rank" -> tp = u.unpackInt();
          case "tp_size" -> tpSize = u.unpackInt();
          case "transport" -> transport = u.unpackString();
          case "layout" -> layout = u.unpackString();
          case "num_blocks" -> numBlocks = u.unpackInt();
          case "block_size" -> blockSize = u.unpackInt();
          case "kv_heads" -> kvHeads = u.unpackInt();
          case "blocks_first_kv_heads" -> blocksFirstKvHeads = u.unpackInt();
          case "total_kv_heads" -> totalKvHeads = u.unpackInt();
          case "head_offset" -> headOffset = u.unpackInt();
          case "head_dim" -> headDim = u.unpackInt();
          case "latent" -> latent = u.unpackInt();
          case "elem_size" -> elem = u.unpackInt();
          case "layer_descriptors" -> {
            int count = u.unpackArrayHeader();
            if (count < 0 || count > 4096) {
              throw new HandshakeException("agent metadata lists " + count + " layers");
            }
            layers = new ArrayList<>(count);
            for (int l = 0; l < count; l++) {
              int len = u.unpackBinaryHeader();
              if (len < 0 || len > RegionDescriptor.MAX_PACKED_BYTES) {
                throw new HandshakeException("layer " + l + " descriptor of " + len + " bytes");
              }
              layers.add(RegionDescriptor.unpack(u.readPayload(len)));
            }
          }
          default -> u.skipValue();
        }
      }
    } catch (HandshakeException e) {
      throw e;
    } catch (MalformedDescriptorException e) {
      throw new HandshakeException("agent metadata has a bad layer descriptor: " + e.getMessage());
    } catch (IOException | RuntimeException e) {
      throw new HandshakeException("malformed agent metadata: " + e);
    }
    if (engineId == null || layout == null || layers == null || tp < 0 || dp < 0 || tpSize < 1) {
      throw new HandshakeException(
          "agent metadata lacks a required field (engine_id, dp_rank, tp_rank, tp_size, layout,"
              + " layer_descriptors)");
    }
    KvCacheGeometry geometry;
    try {
      geometry =
          switch (layout) {
            case "MLA" -> KvCacheGeometry.mla(numBlocks, blockSize, latent, elem);
            case "STANDARD" -> KvCacheGeometry.standard(numBlocks, blockSize, kvHeads, headDim, elem);
            case "BLOCKS_FIRST" ->
                KvCacheGeometry.blocksFirst(numBlocks, blockSize, blocksFirstKvHeads, headDim, elem);
            default -> throw new IllegalArgumentException(
                "layout " + layout + " is not one this build knows (STANDARD, BLOCKS_FIRST, MLA)");
          };
    } catch (IllegalArgumentException e) {
      throw new HandshakeException("agent metadata of " + engineId + ": " + e.getMessage());
    }
    if (tp >= tpSize) {
      throw new HandshakeException(
          "agent metadata of " + engineId + ": tp_rank " + tp + " outside tp_size " + tpSize);
    }
    if ((long) geometry.kvHeads() * tpSize > Integer.MAX_VALUE) {
      throw new HandshakeException(
          "agent metadata of " + engineId + ": " + geometry.kvHeads() + " KV heads x tp_size "
              + tpSize + " overflows the model's head count");
    }
    AgentMetadata m = new AgentMetadata(engineId, dp, tp, tpSize, transport, geometry, layers);
    // Heads are split evenly over the TP ranks; a peer that says otherwise cannot be paired.
    if ((totalKvHeads >= 0 && totalKvHeads != m.totalKvHeads())
        || (headOffset >= 0 && headOffset != m.headOffset())) {
      throw new HandshakeException(
          "agent metadata of " + engineId + "/tp" + tp + " claims heads [" + headOffset + ", "
              + (headOffset + geometry.kvHeads()) + ") of " + totalKvHeads
              + "; kvferry splits heads evenly, which gives [" + m.headOffset() + ", "
              + (m.headOffset() + geometry.kvHeads()) + ") of "
              + m.totalKvHeads());
    }
    return m;
  }

  /** KV heads of the whole model: this rank's heads times the TP size (0 for MLA). */
  public int totalKvHeads() {
    return Math.multiplyExact(geometry.kvHeads(), tpSize);
  }

  /** The first (global) KV head this rank holds: heads are split evenly over the TP ranks. */
  public int headOffset() {
    return Math.multiplyExact(geometry.kvHeads(), tpRank);
  }

  /**
   * Checks that a peer's KV cache can exchange tokens with ours: same layout, head dim (or latent),
   * element size, layer count and total KV heads. num_blocks, block_size and tp_size may differ
   * (the planner maps token ranges and head slices); a mismatch that cannot work is refused.
   *
   * @throws HandshakeException naming both sides' values of the first mismatch
   */
  public void checkCompatibleWith(AgentMetadata peer) throws HandshakeException {
    KvCacheGeometry a = geometry;
    KvCacheGeometry b = peer.geometry;
    // STANDARD and BLOCKS_FIRST hold the same tokens in another order: the planner maps them.
    mismatch("layout", a.layout().name(), b.layout().name(), peer,
        a.layout() == b.layout() || (a.layout().hasHeads() && b.layout().hasHeads()));
    mismatch("head_dim", a.headDim(), b.headDim(), peer);
    mismatch("latent", a.latent(), b.latent(), peer);
    mismatch("elem_size (dtype bytes)", a.elementBytes(), b.elementBytes(), peer);
    mismatch("layer count", layers.size(), peer.layers.size(), peer);
    mismatch(
        "total KV heads (kv_heads x tp_size)",
        a.kvHeads() + " x " + tpSize + " = " + totalKvHeads(),
        b.kvHeads() + " x " + peer.tpSize + " = " + peer.totalKvHeads(),
        peer,
        totalKvHeads() == peer.totalKvHeads());
    for (int l = 0; l < peer.layers.size(); l++) {
      long need = b.layerRegionBytes();
      if (peer.layers.get(l).lengthBytes() < need) {
        throw new HandshakeException(
            "engine " + peer.engineId + " layer " + l + " region is " + peer.layers.get(l).lengthBytes()
                + " bytes, its geometry needs " + need);
      }
    }
  }

  private void mismatch(String what, Object ours, Object theirs, AgentMetadata peer)
      throws HandshakeException {
    mismatch(what, ours, theirs, peer, ours.equals(theirs));
  }

  private void mismatch(
      String what, Object ours, Object theirs, AgentMetadata peer, boolean compatible)
      throws HandshakeException {
    if (!compatible) {
      throw new HandshakeException(
          "incompatible KV caches: " + what + " is " + ours + " on " + engineId + "/tp" + tpRank
              + " but " + theirs + " on " + peer.engineId + "/tp" + peer.tpRank);
    }
  }
}
