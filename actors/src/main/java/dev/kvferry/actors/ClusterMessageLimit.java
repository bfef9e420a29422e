package dev.kvferry.actors;

import com.typesafe.config.Config;
import java.util.Optional;
import java.util.function.Supplier;
import org.apache.pekko.actor.typed.ActorSystem;
import org.apache.pekko.serialization.Serialization;
import org.apache.pekko.serialization.SerializationExtension;

/**
 * Artery drops a message whose serialized form exceeds {@code maximum-frame-size} (256 KiB by
 * default) with only a log line on the sender, so the peer would wait for it until a timer fires.
 * The messages that grow with a request (block lists) are checked here before they are sent, and
 * the request fails at once with a reason that names the setting.
 */
public final class ClusterMessageLimit {
  static final String FRAME_SIZE_KEY = "pekko.remote.artery.advanced.maximum-frame-size";
  /** Room for Artery's envelope (header, recipient and sender paths, manifest). */
  static final int ENVELOPE_BYTES = 4096;
  /** A CBOR int takes at most 5 bytes; below this estimate no message needs measuring. */
  private static final int MAX_BYTES_PER_INT = 5;

  private final long maxPayloadBytes;
  private final Serialization serialization;

  ClusterMessageLimit(long maxPayloadBytes, Serialization serialization) {
    this.maxPayloadBytes = maxPayloadBytes;
    this.serialization = serialization;
  }

  public static ClusterMessageLimit of(ActorSystem<?> system) {
    Config config = system.settings().config();
    long frame = config.hasPath(FRAME_SIZE_KEY) ? config.getBytes(FRAME_SIZE_KEY) : 256 * 1024;
    return new ClusterMessageLimit(frame - ENVELOPE_BYTES, SerializationExtension.get(system));
  }

  /**
   * Why {@code message}, carrying {@code ints} integers, cannot cross the cluster; empty when it
   * fits. Serializes only messages that the cheap upper bound cannot clear; {@code what} names
   * the message in the reason, and is asked only when there is one.
   */
  public Optional<String> whyNotSendable(Object message, int ints, Supplier<String> what) {
    if ((long) ints * MAX_BYTES_PER_INT + ENVELOPE_BYTES <= maxPayloadBytes) {
      return Optional.empty();
    }
    int bytes;
    try {
      bytes = serialization.serializerFor(message.getClass()).toBinary(message).length;
    } catch (java.io.NotSerializableException e) {
      return Optional.of(what.get() + " cannot be serialized: " + e.getMessage());
    }
    if (bytes <= maxPayloadBytes) {
      return Optional.empty();
    }
    return Optional.of(what.get() + " is " + bytes + " bytes serialized, over the " + maxPayloadBytes
        + " a cluster message may carry; raise " + FRAME_SIZE_KEY + " on every node (it is "
        + (maxPayloadBytes + ENVELOPE_BYTES) + " bytes)");
  }
}
