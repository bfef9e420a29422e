package dev.kvferry.actors.engine;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotEquals;

import java.util.HashMap;
import java.util.Map;
import org.junit.jupiter.api.Test;

/** PeerKey writes its hashCode and equals out; they must still key maps by both components. */
class PeerKeyTest {

  @Test
  void keysAreEqualExactlyWhenEngineAndRankAre() {
    PeerKey a = new PeerKey("prefill-0", 1);
    assertEquals(a, new PeerKey(new String("prefill-0"), 1));
    assertEquals(a.hashCode(), new PeerKey(new String("prefill-0"), 1).hashCode());
    assertNotEquals(a, new PeerKey("prefill-0", 0));
    assertNotEquals(a, new PeerKey("prefill-1", 1));
    assertNotEquals(a, (Object) "prefill-0/tp1");
  }

  @Test
  void aMapFindsEachWorkerOfEachEngine() {
    Map<PeerKey, String> m = new HashMap<>();
    for (int e = 0; e < 3; e++) {
      for (int r = 0; r < 4; r++) {
        m.put(new PeerKey("p" + e, r), e + "/" + r);
      }
    }
    assertEquals(12, m.size());
    for (int e = 0; e < 3; e++) {
      for (int r = 0; r < 4; r++) {
        assertEquals(e + "/" + r, m.get(new PeerKey("p" + e, r)));
      }
    }
  }
}
