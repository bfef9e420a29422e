package dev.kvferry.engine;

import java.util.ArrayList;
import java.util.List;
import java.util.ServiceLoader;

/** The engine kinds on the class path: the built-in {@link IdleEngine} and every provider. */
public final class EngineKinds {

  /**
   * The engine port: an engine process drives the node through a Unix domain socket
   * (docs/engine-port.md). Not an {@link EngineKind}: its KV cache and geometry arrive with the
   * engine's hello, after the node started, so the node serves it itself.
   */
  public static final String PORT = "port";

  /** Every kind, the built-in {@code none} first. */
  public static List<EngineKind> all() {
    List<EngineKind> kinds = new ArrayList<>();
    kinds.add(new IdleEngine.Kind());
    ServiceLoader.load(EngineKind.class, EngineKinds.class.getClassLoader()).forEach(kinds::add);
    return List.copyOf(kinds);
  }

  /**
   * @throws IllegalArgumentException naming the kinds available when none is called {@code name}
   */
  public static EngineKind named(String name) {
    List<EngineKind> kinds = all();
    for (EngineKind k : kinds) {
      if (k.name().equals(name)) {
        return k;
      }
    }
    List<String> names = new ArrayList<>(
        kinds.stream().map(k -> k.name() + " (" + k.description() + ")").toList());
    names.add(PORT + " (an engine process, through --engine-socket)");
    throw new IllegalArgumentException("kvferry.node.engine = \"" + name + "\" names no engine kind"
        + " on this class path; available: " + String.join(", ", names));
  }

  private EngineKinds() {}
}
