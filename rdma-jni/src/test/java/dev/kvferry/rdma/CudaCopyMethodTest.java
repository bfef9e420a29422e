package dev.kvferry.rdma;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvferry.rdma.CudaTransport.CopyMethod;
import org.junit.jupiter.api.Test;

/** The node-wide copy method of the cuda transport: parsed without a GPU. */
class CudaCopyMethodTest {

  @Test
  void namesParseInAnyCaseWithDashOrUnderscore() {
    assertEquals(CopyMethod.AUTO, CopyMethod.parse("auto"));
    assertEquals(CopyMethod.KERNEL, CopyMethod.parse("Kernel"));
    assertEquals(CopyMethod.MEMCPY_BATCH, CopyMethod.parse("memcpy-batch"));
    assertEquals(CopyMethod.MEMCPY_BATCH, CopyMethod.parse(" MEMCPY_BATCH "));
  }

  @Test
  void anUnknownNameIsRefusedWithTheValidOnes() {
    IllegalArgumentException e =
        assertThrows(IllegalArgumentException.class, () -> CopyMethod.parse("dma"));
    assertTrue(e.getMessage().contains("kvferry.cuda.copy-method = 'dma'"), e.getMessage());
    assertTrue(e.getMessage().contains("auto, kernel, memcpy-batch"), e.getMessage());
  }

  @Test
  void unsetMeansAuto() {
    String before = System.getProperty(CopyMethod.PROPERTY);
    try {
      System.clearProperty(CopyMethod.PROPERTY);
      assertEquals(CopyMethod.AUTO, CopyMethod.configured());
      System.setProperty(CopyMethod.PROPERTY, "kernel");
      assertEquals(CopyMethod.KERNEL, CopyMethod.configured());
    } finally {
      if (before == null) {
        System.clearProperty(CopyMethod.PROPERTY);
      } else {
        System.setProperty(CopyMethod.PROPERTY, before);
      }
    }
  }
}
