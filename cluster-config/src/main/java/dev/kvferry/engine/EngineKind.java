package dev.kvferry.engine;

/**
 * A kind of engine a node can host ({@code kvferry.node.engine}), found by {@link #name()} through
 * {@link java.util.ServiceLoader}: the node's runtime knows engines only through this interface.
 */
public interface EngineKind {

  /** The name {@code kvferry.node.engine} selects this kind by. */
  String name();

  /** One line for {@code --help} and error messages. */
  String description();

  /** Makes the driver of one engine (one transfer mode of the node). */
  EngineDriver create(EngineSetup setup);
}
