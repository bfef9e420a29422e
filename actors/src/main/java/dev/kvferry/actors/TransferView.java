package dev.kvferry.actors;

import org.jspecify.annotations.Nullable;

/**
 * One transfer in flight, as /kvferry/transfers shows it.
 *
 * @param progress for P's writes ("writing"): how far they got; null for other states
 */
public record TransferView(
    String requestId, String transferId, String state, String peerEngineId, long ageMs,
    @Nullable WriteProgress progress) {}
