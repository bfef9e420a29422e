package dev.kvferry.actors.plan;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;

import org.junit.jupiter.api.Test;

class KvCacheGeometryTest {

  @Test
  void derivesSizesOfAStandardLayer() {
    KvCacheGeometry g = KvCacheGeometry.standard(1000, 16, 8, 128, 2);

    assertEquals(2, g.regionsPerLayer());
    assertEquals(32_768, g.blockBytes());
    assertEquals(32_768, g.blockStrideBytes());
    assertEquals(32_768_000, g.kToVStrideBytes());
    assertEquals(65_536_000, g.layerRegionBytes());
  }

  @Test
  void derivesSizesOfAnMlaLayer() {
    KvCacheGeometry g = KvCacheGeometry.mla(1000, 64, 576, 2);

    assertEquals(1, g.regionsPerLayer());
    assertEquals(73_728, g.blockBytes());
    assertEquals(0, g.kToVStrideBytes());
    assertEquals(73_728_000, g.layerRegionBytes());
  }

  @Test
  void derivesSizesOfABlocksFirstLayer() {
    // [1000, 2, 16, 8, 128] bf16: a block id names one run of its K (32 KiB) and its V.
    KvCacheGeometry g = KvCacheGeometry.blocksFirst(1000, 16, 8, 128, 2);

    assertEquals(1, g.regionsPerLayer());
    assertEquals(2, g.tokenRegions());
    assertEquals(2_048, g.tokenBytes());
    assertEquals(65_536, g.blockBytes());
    assertEquals(65_536, g.blockStrideBytes());
    assertEquals(32_768, g.kToVStrideBytes());
    assertEquals(65_536_000, g.layerRegionBytes());
    assertEquals(
        KvCacheGeometry.standard(1000, 16, 8, 128, 2).layerRegionBytes(), g.layerRegionBytes());
    assertThrows(
        IllegalArgumentException.class,
        () -> new KvCacheGeometry(KvCacheGeometry.Layout.BLOCKS_FIRST, 4, 16, 8, 128, 576, 2));
    assertThrows(
        IllegalArgumentException.class,
        () -> KvCacheGeometry.blocksFirst(Integer.MAX_VALUE, 1 << 20, 1 << 10, 1 << 10, 8));
  }

  @Test
  void rejectsANonPositiveDimensionByName() {
    assertEquals(
        "numBlocks must be at least 1, got 0",
        assertThrows(
                IllegalArgumentException.class, () -> KvCacheGeometry.standard(0, 16, 8, 128, 2))
            .getMessage());
    assertEquals(
        "headDim must be at least 1, got -3",
        assertThrows(
                IllegalArgumentException.class, () -> KvCacheGeometry.standard(4, 16, 8, -3, 2))
            .getMessage());
    assertEquals(
        "latent must be at least 1, got 0",
        assertThrows(IllegalArgumentException.class, () -> KvCacheGeometry.mla(4, 16, 0, 2))
            .getMessage());
  }

  @Test
  void rejectsFieldsTheLayoutDoesNotUse() {
    IllegalArgumentException e =
        assertThrows(
            IllegalArgumentException.class,
            () -> new KvCacheGeometry(KvCacheGeometry.Layout.STANDARD, 4, 16, 8, 128, 576, 2));
    assertEquals(
        "latent is only used by the MLA layout; it must be 0 for STANDARD, got 576",
        e.getMessage());
    assertThrows(
        IllegalArgumentException.class,
        () -> new KvCacheGeometry(KvCacheGeometry.Layout.MLA, 4, 16, 8, 0, 576, 2));
  }

  @Test
  void rejectsALayerLargerThanALongCanAddress() {
    IllegalArgumentException e =
        assertThrows(
            IllegalArgumentException.class,
            () ->
                KvCacheGeometry.standard(
                    Integer.MAX_VALUE, Integer.MAX_VALUE, Integer.MAX_VALUE, 1, 1));
    assertEquals(
        "a KV cache layer of 2147483647 blocks of 2147483647 tokens would exceed 2^63 bytes; check"
            + " the shape",
        e.getMessage());
  }

  @Test
  void aLayerOfMoreThanTwoToTheThirtyBlocksHasItsTrueSizeNotANegativeOne() {
    int blocks = (1 << 30) + 1;
    KvCacheGeometry standard = KvCacheGeometry.standard(blocks, 1, 1, 1, 1);
    assertEquals(2L * blocks, standard.layerRegionBytes());
    assertEquals((long) blocks, standard.kToVStrideBytes());
    KvCacheGeometry big = KvCacheGeometry.standard(Integer.MAX_VALUE, 16, 8, 128, 2);
    assertEquals(2L * Integer.MAX_VALUE * 32_768, big.layerRegionBytes());
    assertEquals((long) Integer.MAX_VALUE * 32_768, big.kToVStrideBytes());
    KvCacheGeometry mla = KvCacheGeometry.mla(Integer.MAX_VALUE, 64, 576, 2);
    assertEquals((long) Integer.MAX_VALUE * 73_728, mla.layerRegionBytes());
  }
}
