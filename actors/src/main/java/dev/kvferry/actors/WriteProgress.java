package dev.kvferry.actors;

/**
 * How far P's writes of one transfer got, so an observer can tell a transfer whose bytes are
 * moving from one that has not started or has finished.
 *
 * @param layersFired layers whose compute event fired (their KV exists on P)
 * @param layerWritesDone layer writes completed, over every D worker written to
 * @param layerWritesInFlight layer writes issued and not completed
 */
public record WriteProgress(int layersFired, int layerWritesDone, int layerWritesInFlight) {}
