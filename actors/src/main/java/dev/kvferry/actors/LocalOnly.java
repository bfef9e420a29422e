package dev.kvferry.actors;

import org.apache.pekko.actor.NoSerializationVerificationNeeded;

/**
 * Marker for messages that never leave their JVM (they carry events, regions or metadata objects);
 * serialization checks skip them. A message that crosses the network is {@link CborSerializable}.
 */
public interface LocalOnly extends NoSerializationVerificationNeeded {}
