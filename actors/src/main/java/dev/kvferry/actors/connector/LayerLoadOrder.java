package dev.kvferry.actors.connector;

/**
 * How {@link ConnectorWorker#waitForLayerQueued} left a layer's load: the engine's stream waits
 * for the event, has nothing to wait for, or the layer's reads did not start in time.
 */
public enum LayerLoadOrder {
  /** The event was recorded behind the layer's reads in flight: the engine's stream waits on it. */
  EVENT_RECORDED,
  /** Nothing of the layer is in flight (landed, its transfer ended, or nothing loads). */
  NOTHING_IN_FLIGHT,
  /** The layer's reads were not all queued within the transfer timeout. */
  TIMED_OUT
}
