package dev.kvferry.node;

import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionStage;

/**
 * Futures from Pekko's Java API (asks, HTTP requests, entities made strict) made plain.
 *
 * <p>Pekko hands them back as Scala futures seen as {@link CompletableFuture}s whose {@code
 * thenApply}, {@code thenCompose}, {@code whenComplete}, {@code handle} and {@code exceptionally}
 * run the callback asynchronously on the JDK's common pool. On a machine of one or two cores that
 * pool has parallelism 1, and the JDK then starts a new thread for every such callback: the
 * router's proxy started five per request (docs/results/2026-12-03-router-jfr-threads.txt).
 * Elsewhere it is a hand-off to a second pool for each step. Callbacks on the plain future run
 * on the thread that completes it (a Pekko dispatcher thread), as callbacks on kvferry's own
 * futures do; none of them may block.
 */
public final class PekkoFutures {

  private PekkoFutures() {}

  /** {@code stage}'s outcome as a plain future, completed on the thread that completes it. */
  public static <T> CompletableFuture<T> plain(CompletionStage<T> stage) {
    if (stage.getClass() == CompletableFuture.class) {
      return (CompletableFuture<T>) stage;
    }
    CompletableFuture<T> out = new CompletableFuture<>();
    // The Executor variant is not overridden by Pekko's futures; Runnable::run keeps the
    // completion on the completing thread.
    stage.whenCompleteAsync((value, error) -> {
      if (error != null) {
        out.completeExceptionally(error);
      } else {
        out.complete(value);
      }
    }, Runnable::run);
    return out;
  }
}
