package dev.kvferry.engine.port;

import java.util.List;
import java.util.Map;
import org.jspecify.annotations.Nullable;

/** An op's arguments, read with the checks that turn bad input into {@code bad_args}. */
record PortArgs(String where, Map<String, Object> map) {

  static PortArgs of(String where, @Nullable Object value) throws PortException {
    if (value == null) {
      return new PortArgs(where, Map.of());
    }
    if (!(value instanceof Map<?, ?>)) {
      throw PortException.badArgs(where + " must be a map");
    }
    @SuppressWarnings("unchecked")
    Map<String, Object> m = (Map<String, Object>) value;
    return new PortArgs(where, m);
  }

  boolean has(String key) {
    return map.get(key) != null;
  }

  String string(String key) throws PortException {
    Object v = require(key);
    if (v instanceof String s) {
      return s;
    }
    throw wrongType(key, "a string", v);
  }

  @Nullable String optionalString(String key) throws PortException {
    return has(key) ? string(key) : null;
  }

  long integer(String key, long min, long max) throws PortException {
    Object v = require(key);
    if (!(v instanceof Long l)) {
      throw wrongType(key, "an integer", v);
    }
    if (l < min || l > max) {
      throw PortException.badArgs(where + "." + key + " = " + l + " is outside " + min + ".." + max);
    }
    return l;
  }

  int integer(String key, int min) throws PortException {
    return (int) integer(key, min, Integer.MAX_VALUE);
  }

  int optionalInt(String key, int min, int fallback) throws PortException {
    return has(key) ? integer(key, min) : fallback;
  }

  boolean bool(String key, boolean fallback) throws PortException {
    Object v = map.get(key);
    if (v == null) {
      return fallback;
    }
    if (v instanceof Boolean b) {
      return b;
    }
    throw wrongType(key, "a boolean", v);
  }

  byte[] bytes(String key) throws PortException {
    Object v = require(key);
    if (v instanceof byte[] b) {
      return b;
    }
    throw wrongType(key, "binary", v);
  }

  /** A list of non-negative ints (block ids); nil when {@code optional} reads as empty. */
  int[] intList(String key, boolean optional) throws PortException {
    Object v = map.get(key);
    if (v == null) {
      if (optional) {
        return new int[0];
      }
      throw PortException.badArgs(where + "." + key + " is missing");
    }
    if (!(v instanceof List<?> list)) {
      throw wrongType(key, "a list of integers", v);
    }
    int[] out = new int[list.size()];
    for (int i = 0; i < out.length; i++) {
      if (!(list.get(i) instanceof Long l) || l < 0 || l > Integer.MAX_VALUE) {
        throw PortException.badArgs(where + "." + key + "[" + i + "] must be an integer >= 0");
      }
      out[i] = (int) (long) l;
    }
    return out;
  }

  /** A list of strings (request ids); absent reads as empty. */
  List<String> stringList(String key) throws PortException {
    return listOf(key, "a list of strings", "a string", v -> v instanceof String str ? str : null);
  }

  /** A list of binaries each exactly {@code length} bytes long; absent reads as empty. */
  List<byte[]> bytesList(String key, int length) throws PortException {
    return listOf(key, "a list of binaries", length + " bytes of binary",
        v -> v instanceof byte[] b && b.length == length ? b : null);
  }

  /** The elements of list {@code key}, each taken by {@code element} (null: refused). */
  private <T> List<T> listOf(String key, String what, String each,
      java.util.function.Function<Object, @Nullable T> element) throws PortException {
    Object v = map.get(key);
    if (v == null) {
      return List.of();
    }
    if (!(v instanceof List<?> list)) {
      throw wrongType(key, what, v);
    }
    java.util.ArrayList<T> out = new java.util.ArrayList<>();
    for (int i = 0; i < list.size(); i++) {
      T t = element.apply(list.get(i));
      if (t == null) {
        throw PortException.badArgs(where + "." + key + "[" + i + "] must be " + each);
      }
      out.add(t);
    }
    return out;
  }

  List<PortArgs> mapList(String key) throws PortException {
    Object v = map.get(key);
    if (v == null) {
      return List.of();
    }
    if (!(v instanceof List<?> list)) {
      throw wrongType(key, "a list of maps", v);
    }
    java.util.ArrayList<PortArgs> out = new java.util.ArrayList<>();
    for (int i = 0; i < list.size(); i++) {
      out.add(PortArgs.of(where + "." + key + "[" + i + "]", list.get(i)));
    }
    return out;
  }

  /** A list of anything (its elements checked by the caller); nil reads as empty. */
  List<?> list(String key) throws PortException {
    Object v = map.get(key);
    if (v == null) {
      return List.of();
    }
    if (!(v instanceof List<?> list)) {
      throw wrongType(key, "a list", v);
    }
    return list;
  }

  PortArgs nested(String key) throws PortException {
    return PortArgs.of(where + "." + key, map.get(key));
  }

  @Nullable Map<String, Object> optionalMap(String key) throws PortException {
    Object v = map.get(key);
    if (v == null) {
      return null;
    }
    return PortArgs.of(where + "." + key, v).map();
  }

  private Object require(String key) throws PortException {
    Object v = map.get(key);
    if (v == null) {
      throw PortException.badArgs(where + "." + key + " is missing");
    }
    return v;
  }

  private PortException wrongType(String key, String expected, Object got) {
    return PortException.badArgs(
        where + "." + key + " must be " + expected + ", got " + got.getClass().getSimpleName());
  }
}
