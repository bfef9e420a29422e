package dev.kvferry.actors;

import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvferry.rdma.CmaTransport;
import java.util.List;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;

/**
 * The writer's GPU options, {@code kvferry.cuda.save-wait} and {@code kvferry.cuda.save-layers}:
 * a value the writer does not know stops it from being made, with the choices; a host transport
 * neither queues copies behind CUDA events nor holds layers, whatever they say. What they change
 * on a GPU runs only where CUDA does: the GPU model check (docs/gpu.md).
 */
class LayerWriterGpuOptionsTest {

  @AfterEach
  void clear() {
    System.clearProperty(LayerWriter.SAVE_WAIT_PROPERTY);
    System.clearProperty(LayerWriter.SAVE_LAYERS_PROPERTY);
  }

  @Test
  void anUnknownSaveWaitIsRefusedWithTheChoices() {
    refused(LayerWriter.SAVE_WAIT_PROPERTY, "sometimes", "gpu or cpu");
  }

  @Test
  void anUnknownSaveLayersIsRefusedWithTheChoices() {
    refused(LayerWriter.SAVE_LAYERS_PROPERTY, "some", "each or together");
  }

  @Test
  void aHostTransportOrdersNothingOnTheGpuWhateverTheOptionsSay() {
    try (CmaTransport cma = new CmaTransport()) {
      for (String wait : new String[] {"gpu", "cpu"}) {
        for (String layers : new String[] {"each", "together"}) {
          System.setProperty(LayerWriter.SAVE_WAIT_PROPERTY, wait);
          System.setProperty(LayerWriter.SAVE_LAYERS_PROPERTY, layers);
          LayerWriter w = new LayerWriter(List.of(), cma, Runnable::run);
          assertFalse(w.ordersOnGpu(), wait + "/" + layers);
          assertFalse(w.savesTogether(), wait + "/" + layers);
        }
      }
    }
  }

  private static void refused(String property, String value, String choices) {
    System.setProperty(property, value);
    try (CmaTransport cma = new CmaTransport()) {
      IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
          () -> new LayerWriter(List.of(), cma, Runnable::run));
      assertTrue(e.getMessage().contains(choices), e.getMessage());
      assertTrue(e.getMessage().contains(value), e.getMessage());
      assertTrue(e.getMessage().contains(property), e.getMessage());
    }
  }
}
