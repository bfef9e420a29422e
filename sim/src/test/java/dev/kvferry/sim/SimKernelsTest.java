package dev.kvferry.sim;

import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.charset.StandardCharsets;
import org.junit.jupiter.api.Test;

class SimKernelsTest {

  @Test
  void simulatorPtxShipsInTheJarWithItsEntryPoints() {
    String ptx = new String(SimKernels.ptx(), StandardCharsets.US_ASCII);
    assertTrue(ptx.startsWith("//") && ptx.contains(".version 9.0") && ptx.contains(".target sm_80"));
    for (String entry : new String[] {
        "kvferry_fill_pattern", "kvferry_verify_pattern", "kvferry_kv_fill", "kvferry_kv_verify"}) {
      assertTrue(ptx.contains(".entry " + entry + "("), entry);
    }
  }
}
