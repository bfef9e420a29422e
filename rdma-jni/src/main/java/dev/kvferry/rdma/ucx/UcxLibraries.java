package dev.kvferry.rdma.ucx;

import com.sun.jna.NativeLibrary;

/** Finds UCX's libraries for the JNA bindings. */
final class UcxLibraries {
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
}
