package dev.kvferry.actors.engine;

import java.time.Duration;

/**
 * The control plane's timeouts and limits. cluster-config fills this from {@code kvferry.*} in
 * reference.conf; tests build it directly.
 *
 * @param handshakeTimeout how long one metadata request to a remote engine may take
 * @param handshakeAttempts attempts before the handshake fails the waiting requests
 * @param handshakeBackoff first pause between attempts; doubles each time
 * @param deferTimeout P, WRITE: how long a layer write waits for D's remote blocks (seed: 60 s)
 * @param transferTimeout D: how long a transfer may take before it fails (seed refinement: 30 s)
 * @param readAbortTimeout P, READ: how long P keeps blocks for a D that never reads them
 * @param terminalIdCapacity how many finished transfer ids are remembered to ignore late messages
 * @param readsAtAdmission D, READ: start a request's reads when the engine allocates its blocks
 *     ({@code update_state_after_alloc}) instead of in the next step's {@code start_load_kv}; the
 *     engine then learns of the KV from {@code get_finished} alone (the load is asynchronous), and
 *     no step waits per layer for it
 * @param reattachGrace how long an engine whose workers all stopped while their node stays in the
 *     cluster (it detached) still counts as listed: one attaching again registers its new worker
 *     after the old one's entry went, and in that moment its transfers must not end as "left"
 */
public record ConnectorSettings(
    Duration handshakeTimeout,
    int handshakeAttempts,
    Duration handshakeBackoff,
    Duration deferTimeout,
    Duration transferTimeout,
    Duration readAbortTimeout,
    int terminalIdCapacity,
    boolean readsAtAdmission,
    Duration reattachGrace) {

  /**
   * Defaults for code that builds settings itself (tests, benchmarks). Reads start in the step
   * here, the seed's order that the actor tests exercise; a node reads {@code
   * kvferry.connector.reads-at-admission}, which reference.conf turns on.
   */
  public static final ConnectorSettings DEFAULTS =
      new ConnectorSettings(
          Duration.ofSeconds(3),
          4,
          Duration.ofMillis(200),
          Duration.ofSeconds(60),
          Duration.ofSeconds(30),
          Duration.ofSeconds(120),
          65_536,
          false,
          Duration.ofSeconds(1));

  public ConnectorSettings {
    if (handshakeAttempts < 1 || terminalIdCapacity < 1) {
      throw new IllegalArgumentException("handshake attempts and terminal id capacity must be >= 1");
    }
    if (reattachGrace.isNegative()) {
      throw new IllegalArgumentException("reattach grace must be >= 0, got " + reattachGrace);
    }
  }

  public ConnectorSettings withTransferTimeout(Duration d) {
    return new ConnectorSettings(
        handshakeTimeout, handshakeAttempts, handshakeBackoff, deferTimeout, d, readAbortTimeout,
        terminalIdCapacity, readsAtAdmission, reattachGrace);
  }

  public ConnectorSettings withDeferTimeout(Duration d) {
    return new ConnectorSettings(
        handshakeTimeout, handshakeAttempts, handshakeBackoff, d, transferTimeout, readAbortTimeout,
        terminalIdCapacity, readsAtAdmission, reattachGrace);
  }

  public ConnectorSettings withReadAbortTimeout(Duration d) {
    return new ConnectorSettings(
        handshakeTimeout, handshakeAttempts, handshakeBackoff, deferTimeout, transferTimeout, d,
        terminalIdCapacity, readsAtAdmission, reattachGrace);
  }

  /** With D's reads started at admission (true) or in the next step's {@code start_load_kv}. */
  public ConnectorSettings withReadsAtAdmission(boolean atAdmission) {
    return new ConnectorSettings(
        handshakeTimeout, handshakeAttempts, handshakeBackoff, deferTimeout, transferTimeout,
        readAbortTimeout, terminalIdCapacity, atAdmission, reattachGrace);
  }

  public ConnectorSettings withHandshake(Duration timeout, int attempts, Duration backoff) {
    return new ConnectorSettings(
        timeout, attempts, backoff, deferTimeout, transferTimeout, readAbortTimeout,
        terminalIdCapacity, readsAtAdmission, reattachGrace);
  }

  public ConnectorSettings withReattachGrace(Duration grace) {
    return new ConnectorSettings(
        handshakeTimeout, handshakeAttempts, handshakeBackoff, deferTimeout, transferTimeout,
        readAbortTimeout, terminalIdCapacity, readsAtAdmission, grace);
  }
}
