package dev.kvferry.rdma.ucx;

import com.sun.jna.Native;
import com.sun.jna.NativeLibrary;
import com.sun.jna.Platform;

/**
 * Finds UCX's libraries for the JNA bindings, and keeps UCX's error-signal handlers out of the JVM
 * before the first of them loads.
 */
final class UcxLibraries {
  static {
    keepErrorSignalsFromUcx();
  }

  private UcxLibraries() {}

  /**
   * The library by its plain name, else by its runtime soname: libucx0 alone installs only
   * {@code libucp.so.0}; the unversioned link comes with libucx-dev.
   */
  static NativeLibrary load(String name, String soname) {
    try {
      return NativeLibrary.getInstance(name);
    } catch (UnsatisfiedLinkError plain) {
      try {
        return NativeLibrary.getInstance(soname);
      } catch (UnsatisfiedLinkError versioned) {
        versioned.addSuppressed(plain);
        throw versioned;
      }
    }
  }

  /**
   * libucs installs handlers for SIGSEGV, SIGBUS, SIGILL and SIGFPE in its load-time constructor,
   * and the JVM raises SIGSEGV on purpose in every thread (safepoint polls, implicit null checks).
   * One such fault between the load and {@code ucs_debug_disable_signals} aborted the process: a
   * JVM with a busy thread and a safepoint storm died in 10 of 10 loads, and a bench peer now and
   * then at start. UCX reads {@code UCX_ERROR_SIGNALS} from the environment in that constructor,
   * so setting it empty first means the handlers are never installed. The variable is set before
   * any UCX library loads, on the class-initialising thread, when the JVM no longer reads its
   * environment (Java's {@code System.getenv} is a copy taken at start).
   */
  private static void keepErrorSignalsFromUcx() {
    try {
      Environ.setenv("UCX_ERROR_SIGNALS", "", 1);
    } catch (LinkageError e) {
      // No libc setenv (not Linux): UCX does not load there either; Ucx's probe says why.
    }
  }

  /** libc's environment, read by native libraries when they load. */
  private static final class Environ {
    static {
      Native.register(Environ.class, Platform.C_LIBRARY_NAME);
    }

    static native int setenv(String name, String value, int overwrite);
  }
}
