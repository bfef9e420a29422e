package dev.kvferry.actors;

import dev.kvferry.rdma.Transport;
import java.util.function.Consumer;
import org.jspecify.annotations.Nullable;

/**
 * D's done words for one {@link ReceiverActor}: hands a word out to each P worker writing a
 * receive, with its blocks (over a transport that stores words), watches for them, and once all
 * have landed reports the receive done in the engine's {@link FinishedSink} at once (two mailbox
 * hops before the receiver's own messages arrive); then tells the receiver, which forgets the
 * transfer as on the last WriteDone. Used from the receiver's thread only; the watcher runs on
 * its own.
 */
final class ReceiveDoneWords implements AutoCloseable {
  private final String label;
  private final Transport transport;
  private final FinishedSink sink;
  private final Consumer<String> tellReceiver;
  /** Whether P's transport can store a done word behind its writes (the same kind as ours). */
  private final boolean peersCanStore;
  /** Null until first needed, and when it could not be made. */
  private @Nullable DoneWordWatcher watcher;
  private boolean unavailable;

  ReceiveDoneWords(
      String label, Transport transport, FinishedSink sink, Consumer<String> tellReceiver) {
    this.label = label;
    this.transport = transport;
    this.sink = sink;
    this.tellReceiver = tellReceiver;
    this.peersCanStore = transport.storesDoneWords();
  }

  /**
   * Done words for receive {@code transferId} of {@code requestId}, one per P worker writing it
   * ({@code writers}, in the order their blocks messages go out), or null where words cannot be
   * used. The watcher reports the receive once every word holds its value. The first call creates
   * the watcher and hands its words to our transport (tcp: the listener stores into them).
   */
  PeerProtocol.DoneWord @Nullable [] handOut(String transferId, String requestId, int writers) {
    if (!peersCanStore || writers < 1 || writers > DoneWordWatcher.MAX_PARTS) {
      return null;
    }
    if (watcher == null && !unavailable) {
      watcher = DoneWordWatcher.tryCreate(label, transport.ringsDoneWordBell(), id -> {
        try {
          sink.landedEarly(id, true, 0);
        } finally {
          tellReceiver.accept(id); // even if an observer threw: the receiver must forget it
        }
      });
      unavailable = watcher == null;
      if (watcher != null) {
        transport.acceptDoneWords(watcher.words());
      }
    }
    DoneWordWatcher w = watcher;
    if (w == null) {
      return null;
    }
    sink.expectEarlyDone(transferId, requestId); // before the words can land
    DoneWordWatcher.Ticket[] tickets = w.register(transferId, writers);
    PeerProtocol.DoneWord[] words = new PeerProtocol.DoneWord[tickets.length];
    for (int i = 0; i < tickets.length; i++) {
      DoneWordWatcher.Ticket t = tickets[i];
      words[i] = new PeerProtocol.DoneWord(t.name(), t.slots(), t.slot(), t.value());
    }
    return words;
  }

  /** The transfer ended otherwise: its word, if it comes, completes nothing. */
  void forget(String transferId) {
    if (watcher != null) {
      watcher.forget(transferId);
    }
  }

  /** Whether the word of {@code transferId} reported it done to the engine already. */
  boolean reportedDone(String transferId) {
    return sink.doneEarly(transferId);
  }

  @Override
  public void close() {
    if (watcher != null) {
      transport.withdrawDoneWords(watcher.words());
      watcher.close();
    }
  }
}
