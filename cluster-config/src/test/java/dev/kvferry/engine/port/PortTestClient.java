package dev.kvferry.engine.port;

import java.io.IOException;
import java.net.StandardProtocolFamily;
import java.net.UnixDomainSocketAddress;
import java.nio.ByteBuffer;
import java.nio.channels.SocketChannel;
import java.nio.file.Path;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.Map;

/** A bare port client for the server's tests: raw frames, so bad ones can be sent too. */
final class PortTestClient implements AutoCloseable {

  private final SocketChannel channel;
  private final PortFrames.Reader frames;
  private long nextId;

  PortTestClient(Path socket) throws IOException {
    channel = SocketChannel.open(StandardProtocolFamily.UNIX);
    channel.connect(UnixDomainSocketAddress.of(socket));
    frames = new PortFrames.Reader(channel, 4096);
  }

  /** Sends a request and returns the whole reply frame. */
  Map<String, Object> call(String op, Map<String, ?> args) throws IOException, PortException {
    long id = nextId++;
    Map<String, Object> frame = new LinkedHashMap<>();
    frame.put("id", id);
    frame.put("op", op);
    frame.put("args", args);
    PortFrames.write(channel, frame);
    Map<String, Object> reply = read();
    if (!Long.valueOf(id).equals(reply.get("id"))) {
      throw new IllegalStateException("reply " + reply + " answers another id than " + id);
    }
    return reply;
  }

  /** The op's result; fails the test with the error when there is one. */
  @SuppressWarnings("unchecked")
  Map<String, Object> ok(String op, Map<String, ?> args) throws IOException, PortException {
    Map<String, Object> reply = call(op, args);
    if (!reply.containsKey("ok")) {
      throw new AssertionError(op + " failed: " + reply.get("error"));
    }
    return (Map<String, Object>) reply.get("ok");
  }

  /** The error code of a reply that must be an error. */
  @SuppressWarnings("unchecked")
  static String errorCode(Map<String, Object> reply) {
    Object e = reply.get("error");
    if (!(e instanceof Map<?, ?>)) {
      throw new AssertionError("expected an error, got " + reply);
    }
    return (String) ((Map<String, Object>) e).get("code");
  }

  void oneWay(String op, Map<String, ?> args) throws IOException {
    Map<String, Object> frame = new HashMap<>();
    frame.put("op", op);
    frame.put("args", args);
    PortFrames.write(channel, frame);
  }

  void raw(byte[] bytes) throws IOException {
    ByteBuffer b = ByteBuffer.wrap(bytes);
    while (b.hasRemaining()) {
      channel.write(b);
    }
  }

  /** The next frame, or an IOException when the node closed the connection. */
  Map<String, Object> read() throws IOException, PortException {
    Map<String, Object> m = frames.next();
    if (m == null) {
      throw new java.io.EOFException("the node closed the connection");
    }
    return m;
  }

  /** Whether the node closed the connection (the next read sees the end). */
  boolean closedByNode() throws IOException {
    try {
      return frames.next() == null;
    } catch (PortException e) {
      return false;
    } catch (IOException e) {
      return true;
    }
  }

  @Override
  public void close() throws IOException {
    channel.close();
  }
}
