package dev.kvferry.actors;

/** How P's writes of one transfer ended (WRITE mode), as its writer tells the tracker. */
public sealed interface SendOutcome {

  /** Every layer was written to every D worker, and D was told. */
  record Sent(long bytes) implements SendOutcome {}

  /** The writes ended early, with the reason; no copy of ours is in flight any more. */
  record Failed(String reason) implements SendOutcome {}
}
