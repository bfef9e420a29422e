package dev.kvferry.rdma.ucx;

import com.sun.jna.Native;

/**
 * libucs (libucp depends on it, so it is present whenever libucp is): the text of a status code,
 * and UCX's error-signal handling switched off, since the JVM owns SIGSEGV (it raises it on
 * purpose for null checks and safepoints) and UCX's handler would abort the process on the first
 * one. UCX's own Java binding does the same when it loads.
 */
final class Ucs {
  static {
    Native.register(Ucs.class, UcxLibraries.load("ucs", "libucs.so.0"));
  }

  private Ucs() {}

  static native String ucs_status_string(int status);

  static native int ucs_global_opts_set_value(String name, String value);

  static native int ucs_global_opts_get_value(String name, byte[] value, long maxBytes);

  /** Gives the error signals (SEGV, BUS, ILL, FPE) back to their previous handlers. */
  static native void ucs_debug_disable_signals();
}
