package dev.kvferry.actors.connector;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.HashMap;
import java.util.List;
import java.util.Map;
import org.junit.jupiter.api.Test;

/** kv_transfer_params as an engine hands them over: every malformed shape is refused by name. */
class KvTransferParamsTest {

  private static Map<String, Object> valid() {
    return new HashMap<>(KvTransferParams.forPrefill("tx-1", "decode-0", 2).toMap());
  }

  private static String refusal(Map<String, Object> map) {
    return assertThrows(InvalidTransferParamsException.class, () -> KvTransferParams.fromMap(map))
        .getMessage();
  }

  private static Map<String, Object> with(String key, Object value) {
    Map<String, Object> m = valid();
    m.put(key, value);
    return m;
  }

  private static Map<String, Object> without(String key) {
    Map<String, Object> m = valid();
    m.remove(key);
    return m;
  }

  @Test
  void validParamsSurviveTheMapRoundTrip() throws Exception {
    KvTransferParams p = new KvTransferParams(true, false, "tx-9", "prefill-3", 1, new int[] {4, 0, 7},
        "10.0.0.1", 5555, 2);
    assertEquals(p, KvTransferParams.fromMap(p.toMap()));
    assertEquals(KvTransferParams.forPrefill("tx-1", "decode-0", 2), KvTransferParams.fromMap(valid()));
    KvTransferParams pinned = new KvTransferParams(true, false, "tx-9", "prefill-3", 1,
        new int[] {4}, "", 0, 2, new int[] {-17, 99});
    assertEquals(pinned, KvTransferParams.fromMap(pinned.toMap()));
    assertEquals(List.of(-17, 99), pinned.toMap().get("remote_worker_uids"));
    assertEquals(99, pinned.remoteWorkerUid(1));
    assertEquals(0, pinned.remoteWorkerUid(2), "a rank it does not name: any incarnation");
    assertTrue(!p.toMap().containsKey("remote_worker_uids"), "left out when it names none");
    assertEquals(0, p.remoteWorkerUid(0));
  }

  @Test
  void missingOrMistypedFieldsAreRefusedNamingTheField() {
    Map<Map<String, Object>, String> cases = new java.util.LinkedHashMap<>();
    cases.put(with("do_remote_decode", "true"), "do_remote_decode must be a boolean, got String true");
    cases.put(with("do_remote_prefill", 1), "do_remote_prefill must be a boolean");
    cases.put(with("do_remote_prefill", true), "sets both do_remote_prefill and do_remote_decode");
    cases.put(without("transfer_id"), "transfer_id is missing");
    cases.put(with("transfer_id", "  "), "transfer_id is empty");
    cases.put(with("transfer_id", 42), "transfer_id must be a string, got Integer 42");
    cases.put(without("remote_engine_id"), "remote_engine_id is missing");
    cases.put(with("remote_engine_id", List.of("d")), "remote_engine_id must be a string");
    cases.put(with("remote_dp_rank", "0"), "remote_dp_rank must be an integer");
    cases.put(with("remote_dp_rank", 1.5), "remote_dp_rank must be an integer, got Double 1.5");
    cases.put(with("remote_dp_rank", 1L << 40), "remote_dp_rank must be an integer");
    cases.put(with("remote_dp_rank", -1), "out of range: remote_dp_rank=-1");
    cases.put(with("tp_size", 0), "out of range");
    cases.put(with("remote_port", 70_000), "remote_port=70000");
    cases.put(with("remote_host", 7), "remote_host must be a string");
    cases.put(with("remote_block_ids", "1,2,3"), "remote_block_ids must be a list of integers");
    cases.put(with("remote_block_ids", List.of(1, -2)), "remote_block_ids[1] must be a non-negative integer");
    cases.put(with("remote_block_ids", List.of(1, "2")),
        "remote_block_ids[1] must be a non-negative integer, got String 2");
    cases.put(with("remote_block_ids", java.util.Arrays.asList(1, null)),
        "remote_block_ids[1] must be a non-negative integer, got null");
    cases.put(with("remote_block_ids", List.of(3L << 31)), "remote_block_ids[0] must be a non-negative integer");
    cases.put(with("remote_block_ids", List.of(2.0)), "remote_block_ids[0] must be a non-negative integer, got Double");
    cases.put(with("remote_worker_uids", 5), "remote_worker_uids must be a list of integers");
    cases.put(with("remote_worker_uids", List.of(1L << 33)), "remote_worker_uids[0] must be a 32-bit integer");
    cases.put(with("remote_worker_uids", List.of("7")), "remote_worker_uids[0] must be a 32-bit integer, got String");
    for (Map.Entry<Map<String, Object>, String> c : cases.entrySet()) {
      String message = refusal(c.getKey());
      assertTrue(message.startsWith("kv_transfer_params"), message);
      assertTrue(message.contains(c.getValue()), "expected '" + c.getValue() + "' in: " + message);
    }
    assertEquals("kv_transfer_params is null", refusal(null));
  }

  @Test
  void emptyParamsMeanNoRemoteTransfer() throws Exception {
    KvTransferParams p = KvTransferParams.fromMap(Map.of());
    assertTrue(!p.doRemotePrefill() && !p.doRemoteDecode() && p.remoteBlockIds().length == 0);
  }
}
