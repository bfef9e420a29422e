package dev.kvferry.actors.connector;

import dev.kvferry.actors.EngineActor;
import org.apache.pekko.actor.testkit.typed.javadsl.ActorTestKit;
import org.apache.pekko.actor.testkit.typed.javadsl.TestProbe;
import org.junit.jupiter.api.AfterAll;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvferry.actors.engine.ConnectorSettings;
import java.time.Clock;
import java.time.Instant;
import java.time.ZoneOffset;
import java.util.List;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.EnumSource;

/** Scheduler-side bookkeeping, without actors: what the engine sees from each call. */
class ConnectorSchedulerTest {

  private static final ActorTestKit KIT = ActorTestKit.create();

  @AfterAll
  static void stopKit() {
    KIT.shutdownTestKit();
  }

  private static final int BLOCK = 16;
  private static final Clock CLOCK = Clock.fixed(Instant.ofEpochMilli(1_000_000), ZoneOffset.UTC);

  private static ConnectorScheduler prefill(TransferMode mode) {
    return new ConnectorScheduler(Role.PREFILL, mode, "prefill-0", 0, BLOCK, List.of(),
        ConnectorSettings.DEFAULTS, CLOCK);
  }

  @Test
  void chunkEndingInsideABlockIsNotTheLastChunk() {
    ConnectorScheduler s = prefill(TransferMode.WRITE);
    ConnectorRequest r = new ConnectorRequest("r", 40, KvTransferParams.forPrefill("tx", "decode-0", 0));
    // First chunk: 35 of 40 tokens; 3 blocks cover 48 slots, so the seed's block test would say
    // "last chunk" and write tokens 35..39 before they are computed.
    int[] blocks = {1, 2, 3};
    s.updateStateAfterAlloc(r, blocks, 0);
    ConnectorMetadata first = s.buildConnectorMeta(new SchedulerOutput(
        List.of(new SchedulerOutput.NewRequest("r", blocks, 35)), List.of()));
    assertTrue(first.reqsToSave().isEmpty(), "saved before the last chunk was computed");
    ConnectorMetadata second = s.buildConnectorMeta(new SchedulerOutput(
        List.of(), List.of(new SchedulerOutput.CachedRequest("r", new int[0], 40))));
    assertEquals(1, second.reqsToSave().size());
    assertArrayEquals(blocks, second.reqsToSave().get(0).localBlockIds());
  }

  /**
   * P, WRITE: request "r" of 40 tokens allocated blocks 1 and 2 and scheduled for its first 20
   * tokens (nothing saved yet): the state a preemption finds.
   */
  private ConnectorScheduler firstChunkScheduled(ConnectorRequest r) {
    ConnectorScheduler s = prefill(TransferMode.WRITE);
    s.updateStateAfterAlloc(r, new int[] {1, 2}, 0);
    assertTrue(s.buildConnectorMeta(new SchedulerOutput(
        List.of(new SchedulerOutput.NewRequest("r", new int[] {1, 2}, 20)), List.of()))
        .reqsToSave().isEmpty());
    return s;
  }

  private static ConnectorRequest fortyTokensForDecode() {
    return new ConnectorRequest("r", 40, KvTransferParams.forPrefill("tx", "decode-0", 0));
  }

  private static int[] savedBlocksOfOnlySave(ConnectorMetadata m) {
    assertEquals(1, m.reqsToSave().size(), m.reqsToSave().toString());
    return m.reqsToSave().get(0).localBlockIds();
  }

  @Test
  void aPrefillPreemptedBetweenChunksIsSavedFromTheBlocksItWasGivenBack() {
    ConnectorScheduler s = firstChunkScheduled(fortyTokensForDecode());
    // Preempted (blocks 1 and 2 freed), then scheduled again from its start with new blocks.
    assertTrue(s.buildConnectorMeta(new SchedulerOutput(List.of(), List.of(
        new SchedulerOutput.CachedRequest("r", new int[] {8, 9}, 20, true)))).reqsToSave().isEmpty());
    assertArrayEquals(new int[] {8, 9, 5}, savedBlocksOfOnlySave(s.buildConnectorMeta(new SchedulerOutput(
        List.of(), List.of(new SchedulerOutput.CachedRequest("r", new int[] {5}, 40))))));
  }

  @Test
  void aPrefillPreemptedAndAllocatedAgainIsSavedOnceFromItsNewBlocks() {
    // vLLM's own order: a preempted request goes back to waiting, and when it is scheduled again
    // its blocks are allocated again (update_state_after_alloc) before it shows as resumed.
    ConnectorRequest r = fortyTokensForDecode();
    ConnectorScheduler s = firstChunkScheduled(r);
    s.updateStateAfterAlloc(r, new int[] {8, 9, 5}, 0);
    assertArrayEquals(new int[] {8, 9, 5}, savedBlocksOfOnlySave(s.buildConnectorMeta(new SchedulerOutput(
        List.of(), List.of(new SchedulerOutput.CachedRequest("r", new int[] {8, 9, 5}, 40, true))))));
    assertTrue(s.buildConnectorMeta(new SchedulerOutput(List.of(), List.of(
        new SchedulerOutput.CachedRequest("r", null, 41)))).reqsToSave().isEmpty(), "saved twice");
  }

  @Test
  void aPrefillPreemptedAndScheduledAgainAsNewIsSavedFromItsNewBlocks() {
    ConnectorScheduler s = firstChunkScheduled(fortyTokensForDecode());
    assertArrayEquals(new int[] {6, 4, 3}, savedBlocksOfOnlySave(s.buildConnectorMeta(new SchedulerOutput(
        List.of(new SchedulerOutput.NewRequest("r", new int[] {6, 4, 3}, 40)), List.of()))));
  }

  @Test
  void blockTestDecidesWhenTheEngineGivesNoTokenCount() {
    ConnectorScheduler s = prefill(TransferMode.WRITE);
    ConnectorRequest r = new ConnectorRequest("r", 40, KvTransferParams.forPrefill("tx", "decode-0", 0));
    s.updateStateAfterAlloc(r, new int[] {1, 2}, 0);
    assertTrue(s.buildConnectorMeta(new SchedulerOutput(
        List.of(new SchedulerOutput.NewRequest("r", new int[] {1, 2})), List.of())).reqsToSave().isEmpty());
    ConnectorMetadata m = s.buildConnectorMeta(new SchedulerOutput(
        List.of(), List.of(new SchedulerOutput.CachedRequest("r", new int[] {7}))));
    assertArrayEquals(new int[] {1, 2, 7}, m.reqsToSave().get(0).localBlockIds());
  }

  @Test
  void readModePrefillKeepsBlocksUntilTheDeadlineAndHandsDecodeItsBlockIds() {
    ConnectorScheduler s = prefill(TransferMode.READ);
    ConnectorRequest r = new ConnectorRequest("r", 20, KvTransferParams.forPrefill("tx", "decode-0", 0));
    r.setStatus(ConnectorRequest.Status.FINISHED_LENGTH_CAPPED);
    FinishDecision d = s.requestFinished(r, new int[] {4, 5});
    assertTrue(d.delayFreeBlocks());
    assertTrue(d.paramsForPeer().doRemotePrefill());
    assertArrayEquals(new int[] {4, 5}, d.paramsForPeer().remoteBlockIds());
    assertEquals("prefill-0", d.paramsForPeer().remoteEngineId());
    ConnectorMetadata m = s.buildConnectorMeta(new SchedulerOutput(List.of(), List.of()));
    assertEquals(1, m.reqsToSend().size());
    assertEquals(1_000_000 + ConnectorSettings.DEFAULTS.readAbortTimeout().toMillis(),
        m.reqsToSend().get(0).deadlineEpochMs());
  }

  @Test
  void readModePrefillHandsNoReaderTheBlocksOfATransferIdUsedAgain() {
    ConnectorScheduler s = prefill(TransferMode.READ);
    ConnectorRequest first = new ConnectorRequest("r1", 20, KvTransferParams.forPrefill("tx", "decode-0", 0));
    first.setStatus(ConnectorRequest.Status.FINISHED_LENGTH_CAPPED);
    assertTrue(s.requestFinished(first, new int[] {4, 5}).delayFreeBlocks());
    // Another request under the same transfer id: its worker refuses the id and frees the blocks
    // at once, so a D handed them would read blocks the engine reuses. It gets no params.
    ConnectorRequest again = new ConnectorRequest("r2", 20, KvTransferParams.forPrefill("tx", "decode-1", 0));
    again.setStatus(ConnectorRequest.Status.FINISHED_LENGTH_CAPPED);
    FinishDecision d = s.requestFinished(again, new int[] {6, 7});
    assertEquals(FinishDecision.FREE_NOW, d);
    assertEquals(1, s.buildConnectorMeta(new SchedulerOutput(List.of(), List.of())).reqsToSend().size());
  }

  /** The workers hear at once, not with a next step the engine may never run. */
  private static void assertWorkerToldToReadNothing(TestProbe<EngineActor.Command> worker) {
    EngineActor.StartLoad told = worker.expectMessageClass(EngineActor.StartLoad.class);
    assertEquals(1, told.metadata().reqsToRecv().size(), "P is still told to free its blocks");
    assertEquals(0, told.metadata().reqsToRecv().get(0).localBlockIds().length,
        "read into blocks the engine freed");
  }

  @Test
  void decodeAbortedBeforeSchedulingStillTellsPrefillToFree() {
    TestProbe<EngineActor.Command> worker = KIT.createTestProbe();
    ConnectorScheduler s = new ConnectorScheduler(Role.DECODE, TransferMode.READ, "decode-0", 0,
        BLOCK, List.of(worker.ref()), ConnectorSettings.DEFAULTS, CLOCK);
    ConnectorRequest r = new ConnectorRequest("r", 20, KvTransferParams.forDecode("tx", "prefill-0", 0));
    r.setStatus(ConnectorRequest.Status.FINISHED_ABORTED);
    FinishDecision d = s.requestFinished(r, new int[0]);
    assertFalse(d.delayFreeBlocks());
    assertNull(d.paramsForPeer());
    assertFalse(r.params().doRemotePrefill(), "only one transfer per request");
    assertWorkerToldToReadNothing(worker);
    ConnectorMetadata m = s.buildConnectorMeta(new SchedulerOutput(List.of(), List.of()));
    assertEquals(0, m.reqsToRecv().size(), "told once");
  }

  @Test
  void matchedTokensFollowTheSeed() {
    ConnectorScheduler write = new ConnectorScheduler(Role.DECODE, TransferMode.WRITE, "d", 0,
        BLOCK, List.of(), ConnectorSettings.DEFAULTS, CLOCK);
    ConnectorScheduler read = new ConnectorScheduler(Role.DECODE, TransferMode.READ, "d", 0,
        BLOCK, List.of(), ConnectorSettings.DEFAULTS, CLOCK);
    ConnectorRequest r = new ConnectorRequest("r", 100, KvTransferParams.forDecode("tx", "p", 0));
    assertEquals(new MatchedTokens(84, true), write.numNewMatchedTokens(r, 16));
    assertEquals(new MatchedTokens(83, true), read.numNewMatchedTokens(r, 16),
        "READ loads asynchronously: the engine must wait for it");
    assertEquals(MatchedTokens.NONE, prefill(TransferMode.WRITE).numNewMatchedTokens(r, 0));
  }

  @Test
  void malformedParamsNameTheField() {
    InvalidTransferParamsException e = org.junit.jupiter.api.Assertions.assertThrows(
        InvalidTransferParamsException.class,
        () -> KvTransferParams.fromMap(java.util.Map.of("do_remote_prefill", "yes")));
    assertTrue(e.getMessage().contains("do_remote_prefill"), e.getMessage());
    e = org.junit.jupiter.api.Assertions.assertThrows(InvalidTransferParamsException.class,
        () -> KvTransferParams.fromMap(java.util.Map.of("do_remote_decode", true)));
    assertTrue(e.getMessage().contains("transfer_id"), e.getMessage());
  }

  @Test
  void aLastChunkThatNeedsNoNewBlockIsStillSaved() {
    ConnectorScheduler s = prefill(TransferMode.WRITE);
    ConnectorRequest r = new ConnectorRequest("r", 40, KvTransferParams.forPrefill("tx", "decode-0", 0));
    int[] blocks = {1, 2, 3};
    s.updateStateAfterAlloc(r, blocks, 0);
    assertTrue(s.buildConnectorMeta(new SchedulerOutput(
        List.of(new SchedulerOutput.NewRequest("r", blocks, 35)), List.of())).reqsToSave().isEmpty());
    // vLLM passes no new block ids when the final chunk fits in the blocks already allocated.
    ConnectorMetadata last = s.buildConnectorMeta(new SchedulerOutput(
        List.of(), List.of(new SchedulerOutput.CachedRequest("r", null, 40))));
    assertEquals(1, last.reqsToSave().size(), "the request was never saved");
    assertArrayEquals(blocks, last.reqsToSave().get(0).localBlockIds());
  }

  /**
   * WRITE: a P request whose save was handed to the workers keeps its blocks whether it was
   * aborted or stopped (a stop token sampled as P's one token): its writes may still read them.
   */
  @ParameterizedTest
  @EnumSource(value = ConnectorRequest.Status.class, names = {"FINISHED_ABORTED", "FINISHED_STOPPED"})
  void prefillEndedAfterItsSaveWasHandedToTheWorkersDelaysItsFree(ConnectorRequest.Status end) {
    ConnectorScheduler s = prefill(TransferMode.WRITE);
    ConnectorRequest saved = new ConnectorRequest("a", 8, KvTransferParams.forPrefill("tx-a", "decode-0", 0));
    ConnectorRequest early = new ConnectorRequest("b", 40, KvTransferParams.forPrefill("tx-b", "decode-0", 0));
    s.updateStateAfterAlloc(saved, new int[] {1}, 0);
    s.updateStateAfterAlloc(early, new int[] {2}, 0);
    ConnectorMetadata m = s.buildConnectorMeta(new SchedulerOutput(List.of(
        new SchedulerOutput.NewRequest("a", new int[] {1}, 8),
        new SchedulerOutput.NewRequest("b", new int[] {2}, 16)), List.of()));
    assertEquals(List.of("a"), m.reqsToSave().stream().map(r -> r.requestId()).toList());
    saved.setStatus(end);
    early.setStatus(end);
    FinishDecision d = s.requestFinished(saved, new int[] {1});
    assertTrue(d.delayFreeBlocks(), "its writes may still read its blocks");
    assertNull(d.paramsForPeer(), "an ended request hands D nothing, as in the seed");
    assertFalse(s.requestFinished(early, new int[] {2}).delayFreeBlocks(),
        "nothing was handed to the workers: free at once");
  }

  @Test
  void readPrefillThatStoppedFreesAtOnce() {
    ConnectorScheduler read = prefill(TransferMode.READ);
    ConnectorRequest r = new ConnectorRequest("r", 8, KvTransferParams.forPrefill("tx-r", "decode-0", 0));
    read.updateStateAfterAlloc(r, new int[] {1}, 0);
    read.buildConnectorMeta(new SchedulerOutput(
        List.of(new SchedulerOutput.NewRequest("r", new int[] {1}, 8)), List.of()));
    r.setStatus(ConnectorRequest.Status.FINISHED_STOPPED);
    assertEquals(FinishDecision.FREE_NOW, read.requestFinished(r, new int[] {1}),
        "in READ nothing reads P's blocks before D has its params");
  }

  @Test
  void decodeAbortedAfterAllocationButBeforeItsLoadWasHandedOverReadsNothing() {
    TestProbe<EngineActor.Command> worker = KIT.createTestProbe();
    ConnectorScheduler s = new ConnectorScheduler(Role.DECODE, TransferMode.READ, "decode-0", 0,
        BLOCK, List.of(worker.ref()), ConnectorSettings.DEFAULTS, CLOCK);
    KvTransferParams p = new KvTransferParams(true, false, "tx", "prefill-0", 0, new int[] {8, 9},
        "", 0, 1);
    ConnectorRequest r = new ConnectorRequest("r", 20, p);
    s.updateStateAfterAlloc(r, new int[] {4, 5}, 19);
    r.setStatus(ConnectorRequest.Status.FINISHED_ABORTED);
    assertFalse(s.requestFinished(r, new int[] {4, 5}).delayFreeBlocks());
    assertWorkerToldToReadNothing(worker);
    ConnectorMetadata m = s.buildConnectorMeta(new SchedulerOutput(List.of(), List.of()));
    assertEquals(0, m.reqsToRecv().size(), "told once, nothing read into the freed blocks");
  }

  @Test
  void decodeAbortedWhileItsLoadIsInFlightDelaysItsFree() {
    ConnectorScheduler s = new ConnectorScheduler(Role.DECODE, TransferMode.READ, "decode-0", 0,
        BLOCK, List.of(), ConnectorSettings.DEFAULTS, CLOCK);
    KvTransferParams p = new KvTransferParams(true, false, "tx", "prefill-0", 0, new int[] {8, 9},
        "", 0, 1);
    ConnectorRequest r = new ConnectorRequest("r", 20, p);
    s.updateStateAfterAlloc(r, new int[] {4, 5}, 19);
    assertEquals(1, s.buildConnectorMeta(new SchedulerOutput(List.of(), List.of())).reqsToRecv().size());
    r.setStatus(ConnectorRequest.Status.FINISHED_ABORTED);
    assertTrue(s.requestFinished(r, new int[] {4, 5}).delayFreeBlocks());
  }

  @Test
  void readOfAPromptWhoseTokensBeforeTheLastEndOnABlockBoundaryLinesUpPrefillsBlocks() {
    ConnectorScheduler s = new ConnectorScheduler(Role.DECODE, TransferMode.READ, "decode-0", 0,
        BLOCK, List.of(), ConnectorSettings.DEFAULTS, CLOCK);
    // 97 tokens: P holds them in 7 blocks; D loads the first 96 (6 blocks) and computes the last.
    KvTransferParams p = new KvTransferParams(true, false, "tx", "prefill-0", 0,
        new int[] {10, 11, 12, 13, 14, 15, 16}, "", 0, 1);
    ConnectorRequest r = new ConnectorRequest("r", 97, p);
    assertEquals(new MatchedTokens(96, true), s.numNewMatchedTokens(r, 0));
    s.updateStateAfterAlloc(r, new int[] {0, 1, 2, 3, 4, 5}, 96);
    ReqMeta m = s.buildConnectorMeta(new SchedulerOutput(List.of(), List.of())).reqsToRecv().get(0);
    assertArrayEquals(new int[] {10, 11, 12, 13, 14, 15}, m.remoteBlockIds(),
        "P's block holding only the last token is not read (the tail would be one block off)");
  }

  @Test
  void readWithAPrefixHitOnDecodeStillTakesTheTailOfTheBlocksBeforeTheLastToken() {
    ConnectorScheduler s = new ConnectorScheduler(Role.DECODE, TransferMode.READ, "decode-0", 0,
        BLOCK, List.of(), ConnectorSettings.DEFAULTS, CLOCK);
    KvTransferParams p = new KvTransferParams(true, false, "tx", "prefill-0", 0,
        new int[] {10, 11, 12, 13, 14, 15, 16}, "", 0, 1);
    ConnectorRequest r = new ConnectorRequest("r", 97, p);
    assertEquals(new MatchedTokens(64, true), s.numNewMatchedTokens(r, 32));
    s.updateStateAfterAlloc(r, new int[] {4, 5, 6, 7}, 64);
    ReqMeta m = s.buildConnectorMeta(new SchedulerOutput(List.of(), List.of())).reqsToRecv().get(0);
    assertArrayEquals(new int[] {10, 11, 12, 13, 14, 15}, m.remoteBlockIds());
  }

  @Test
  void readIntoBlocksForTheWholePromptKeepsEveryOneOfPrefillsBlocks() {
    ConnectorScheduler s = new ConnectorScheduler(Role.DECODE, TransferMode.READ, "decode-0", 0,
        BLOCK, List.of(), ConnectorSettings.DEFAULTS, CLOCK);
    KvTransferParams p = new KvTransferParams(true, false, "tx", "prefill-0", 0,
        new int[] {10, 11, 12, 13, 14, 15, 16}, "", 0, 1);
    ConnectorRequest r = new ConnectorRequest("r", 97, p);
    s.numNewMatchedTokens(r, 16);
    s.updateStateAfterAlloc(r, new int[] {1, 2, 3, 4, 5, 6}, 80); // D's blocks reach token 96
    ReqMeta m = s.buildConnectorMeta(new SchedulerOutput(List.of(), List.of())).reqsToRecv().get(0);
    assertArrayEquals(new int[] {10, 11, 12, 13, 14, 15, 16}, m.remoteBlockIds());
  }

  private static final ConnectorSettings AT_ADMISSION =
      ConnectorSettings.DEFAULTS.withReadsAtAdmission(true);

  @Test
  void readsAtAdmissionGoToEveryWorkerWhenTheBlocksAreAllocatedAndNotWithTheStep() {
    TestProbe<EngineActor.Command> rank0 = KIT.createTestProbe();
    TestProbe<EngineActor.Command> rank1 = KIT.createTestProbe();
    ConnectorScheduler s = new ConnectorScheduler(Role.DECODE, TransferMode.READ, "decode-0", 0,
        BLOCK, List.of(rank0.ref(), rank1.ref()), AT_ADMISSION, CLOCK);
    KvTransferParams p = new KvTransferParams(true, false, "tx", "prefill-0", 0,
        new int[] {10, 11, 12, 13, 14, 15, 16}, "", 0, 1);
    ConnectorRequest r = new ConnectorRequest("r", 97, p);
    s.numNewMatchedTokens(r, 0);
    s.updateStateAfterAlloc(r, new int[] {0, 1, 2, 3, 4, 5}, 96);
    for (TestProbe<EngineActor.Command> w : List.of(rank0, rank1)) {
      ReqMeta load = w.expectMessageClass(EngineActor.StartLoad.class).metadata().reqsToRecv().get(0);
      assertArrayEquals(new int[] {0, 1, 2, 3, 4, 5}, load.localBlockIds());
      assertArrayEquals(new int[] {10, 11, 12, 13, 14, 15}, load.remoteBlockIds(),
          "the same blocks the step's metadata would have named");
    }
    assertFalse(r.params().doRemotePrefill(), "only one transfer per request");
    ConnectorMetadata m = s.buildConnectorMeta(new SchedulerOutput(List.of(), List.of()));
    assertEquals(0, m.reqsToRecv().size(), "started once, so no step waits per layer for it");
    // Its blocks are lent from admission: an abort now must wait for the workers.
    r.setStatus(ConnectorRequest.Status.FINISHED_ABORTED);
    assertTrue(s.requestFinished(r, new int[] {0, 1, 2, 3, 4, 5}).delayFreeBlocks());
    for (TestProbe<EngineActor.Command> w : List.of(rank0, rank1)) {
      assertEquals("tx", w.expectMessageClass(EngineActor.AbortReceive.class).transferId());
    }
  }

  @Test
  void readsAtAdmissionWithAFullPrefixHitTellPrefillToFreeAndLendNothing() {
    TestProbe<EngineActor.Command> worker = KIT.createTestProbe();
    ConnectorScheduler s = new ConnectorScheduler(Role.DECODE, TransferMode.READ, "decode-0", 0,
        BLOCK, List.of(worker.ref()), AT_ADMISSION, CLOCK);
    KvTransferParams p = new KvTransferParams(true, false, "tx", "prefill-0", 0, new int[] {8, 9},
        "", 0, 1);
    ConnectorRequest r = new ConnectorRequest("r", 20, p);
    s.updateStateAfterAlloc(r, new int[0], 0);
    assertWorkerToldToReadNothing(worker);
    r.setStatus(ConnectorRequest.Status.FINISHED_ABORTED);
    assertFalse(s.requestFinished(r, new int[0]).delayFreeBlocks(), "nothing reads into them");
    worker.expectNoMessage(java.time.Duration.ofMillis(50));
  }
}
