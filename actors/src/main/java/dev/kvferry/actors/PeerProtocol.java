package dev.kvferry.actors;

import dev.kvferry.actors.engine.AgentMetadata;
import org.apache.pekko.actor.typed.ActorRef;
import org.jspecify.annotations.Nullable;

/**
 * The messages one engine's worker sends another's over the network, all in one place. Every one
 * is {@link CborSerializable} (Jackson CBOR, bound in this module's reference.conf) but the
 * per-transfer ones, which {@link PeerMessageSerializer} writes (a change to their fields changes
 * its layout and manifest version); the workers that receive them are {@link EngineActor}s. Ranks
 * are always the sender's or receiver's real TP rank; a part that may be absent is a nested record
 * that is null when absent, never a sentinel.
 */
public interface PeerProtocol {

  /** A message to a peer's {@link EngineActor}. */
  sealed interface Message extends EngineActor.Command, CborSerializable
      permits RemoteBlocks, WriteDone, TransferFailed, Release, GetMetadata {}

  /**
   * D to P, WRITE: D's blocks for a transfer (the seed's "remote_blocks" notification), from D's
   * worker {@code decodeTpRank}.
   *
   * @param doneWord where P's transport stores done words (cuda, cma, tcp): where this P worker
   *     tells D that its writes landed before WriteDone arrives (each P worker writing the
   *     transfer gets a word of its own); null: messages only
   * @param decodeWorkerUid the actor uid of the sending worker's incarnation: P writes into the
   *     memory of that incarnation only (an engine attached again under the same id has other
   *     memory, and its old incarnation can stay listed for a moment); 0: whichever is listed
   */
  record RemoteBlocks(
      String transferId,
      String requestId,
      int[] blockIds,
      String decodeEngineId,
      int decodeDpRank,
      int decodeTpRank,
      @Nullable DoneWord doneWord,
      int decodeWorkerUid)
      implements Message {
    /** Messages only: no done word; any incarnation. */
    public RemoteBlocks(
        String transferId, String requestId, int[] blockIds, String decodeEngineId,
        int decodeDpRank, int decodeTpRank) {
      this(transferId, requestId, blockIds, decodeEngineId, decodeDpRank, decodeTpRank, null, 0);
    }

    /** Any incarnation. */
    public RemoteBlocks(
        String transferId, String requestId, int[] blockIds, String decodeEngineId,
        int decodeDpRank, int decodeTpRank, @Nullable DoneWord doneWord) {
      this(transferId, requestId, blockIds, decodeEngineId, decodeDpRank, decodeTpRank, doneWord,
          0);
    }
  }

  /**
   * Where P's transport stores {@code value}, behind the transfer's last write: word {@code slot}
   * of the {@code slots} in D's done-word file {@code file} (a bare name). cuda and cma map it
   * only if it is a kvferry done-word file under /dev/shm (SharedDoneWords.checkedPeerFile); tcp
   * sends it in band and D's listener stores only into D's own files.
   */
  record DoneWord(String file, int slots, int slot, long value) {
    /** Whether the peer's values can be used at all (they come from the network). */
    public boolean usable() {
      return !file.isEmpty() && slot >= 0 && slot < slots;
    }
  }

  /** P to D, WRITE: every layer of a transfer has been written by P's worker {@code producerTpRank}. */
  record WriteDone(String transferId, String producerEngineId, int producerTpRank)
      implements Message {}

  /**
   * Either way: the sender, worker {@code senderTpRank} of engine {@code engineId}, ended a
   * transfer with the reason. From P it also says that no copy of its will touch D's blocks any
   * more (P sends it only once its writes in flight have landed); from D it asks P to abandon, and
   * P answers with its own TransferFailed.
   */
  record TransferFailed(String transferId, String engineId, String reason, int senderTpRank)
      implements Message {}

  /**
   * D to P, READ: D's worker {@code decodeTpRank} of {@code decodeTpSize} is done with a
   * transfer's blocks (read, failed or aborted); P frees them once every D worker that reads from
   * it has released them.
   */
  record Release(String transferId, String decodeEngineId, int decodeTpRank, int decodeTpSize)
      implements Message {}

  /**
   * Handshake: send me your metadata. Also introduces the asking worker: a peer that reads our
   * blocks (READ) asks for our metadata first, so the server learns of it, and can notice when it
   * stops, even when the Receptionist's listing of it lags behind or never shows it (an engine
   * that attached and died within a moment).
   *
   * @param asker the asking worker (its actor name says its engine id); null when unknown
   */
  record GetMetadata(ActorRef<MetadataReply> replyTo, @Nullable ActorRef<EngineActor.Command> asker)
      implements Message {
    /** An anonymous asker. */
    public GetMetadata(ActorRef<MetadataReply> replyTo) {
      this(replyTo, null);
    }
  }

  /** Handshake answer: the msgpack-packed {@link AgentMetadata} of one worker. */
  record MetadataReply(String engineId, int tpRank, byte[] blob) implements CborSerializable {}
}
