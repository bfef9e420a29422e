package dev.kvferry.sim;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;

import dev.kvferry.engine.EngineKinds;
import org.junit.jupiter.api.Test;

class SimEngineKindTest {

  @Test
  void theSimulatedEngineIsFoundByNameThroughTheServiceLoader() {
    assertInstanceOf(SimEngineKind.class, EngineKinds.named("sim"));
    assertEquals(
        java.util.List.of("none", "sim"),
        EngineKinds.all().stream().map(k -> k.name()).toList());
  }
}
