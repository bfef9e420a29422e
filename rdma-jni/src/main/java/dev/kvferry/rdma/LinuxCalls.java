package dev.kvferry.rdma;

import com.sun.jna.Native;
import com.sun.jna.Platform;

/**
 * Binds the native methods of a class of optional Linux calls to libc. Not part of {@link LibC},
 * whose loading binds every call the data plane needs and fails without them: these callers do
 * without theirs (poll instead of a futex, keep the kernel's timer slack).
 */
final class LinuxCalls {
  private LinuxCalls() {}

  /** Whether {@code calls}' natives are bound: false off Linux or where libc lacks one. */
  static boolean register(Class<?> calls) {
    if (!Platform.isLinux()) {
      return false;
    }
    try {
      Native.register(calls, Platform.C_LIBRARY_NAME);
      return true;
    } catch (LinkageError e) { // the library lacks a call, or JNA itself did not load
      return false;
    }
  }
}
