package dev.kvferry.rdma.ucx;

import com.sun.jna.LastErrorException;
import com.sun.jna.Native;
import com.sun.jna.Platform;

/** poll(2) on the worker's event fd: the progress thread sleeps here when nothing is in flight. */
final class LibPoll {
  static {
    Native.register(LibPoll.class, Platform.C_LIBRARY_NAME);
  }

  static final short POLLIN = 0x1;
  static final int EINTR = 4;

  private LibPoll() {}

  /** int poll(struct pollfd *fds, nfds_t nfds, int timeout); a pollfd is 8 bytes. */
  static native int poll(long fds, long count, int timeoutMs) throws LastErrorException;
}
