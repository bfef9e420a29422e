package dev.kvferry.actors;

/**
 * Marker for messages that cross the network between nodes; bound to Jackson CBOR in this
 * module's reference.conf.
 */
public interface CborSerializable {}
