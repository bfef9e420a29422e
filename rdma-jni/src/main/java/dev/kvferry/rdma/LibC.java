package dev.kvferry.rdma;

import com.sun.jna.LastErrorException;
import com.sun.jna.Native;
import com.sun.jna.Platform;

/**
 * The libc calls of the host data plane, through JNA's direct mapping (no reflection, no argument
 * boxing on the hot path). Pointers travel as {@code long} so callers allocate nothing per call.
 */
final class LibC {
  static {
    Native.register(LibC.class, Platform.C_LIBRARY_NAME);
  }

  static final int EPERM = 1;
  static final int ESRCH = 3;
  static final int EINTR = 4;
  static final int ENOMEM = 12;
  static final int EFAULT = 14;
  static final int EINVAL = 22;
  static final int ENOSYS = 38;

  private LibC() {}

  static final int PROT_READ = 0x1;
  static final int PROT_WRITE = 0x2;
  static final int MAP_SHARED = 0x01;
  static final int MAP_PRIVATE = 0x02;
  static final int O_RDWR = 0x2;
  static final int O_CLOEXEC = 0x80000;
  static final int MAP_ANONYMOUS = 0x20;
  static final int MAP_FIXED = 0x10;
  static final int MADV_HUGEPAGE = 14;
  static final int MFD_CLOEXEC = 0x1;
  static final int MFD_ALLOW_SEALING = 0x2;
  static final int F_ADD_SEALS = 1033;
  static final int F_GET_SEALS = 1034;
  static final int F_SEAL_SEAL = 0x1;
  static final int F_SEAL_SHRINK = 0x2;
  static final int F_SEAL_GROW = 0x4;

  static native long memmove(long dst, long src, long n);

  static native long memset(long dst, int value, long n);

  /** Returns the mapping's address; MAP_FAILED (-1) raises LastErrorException. */
  static native long mmap(long addr, long length, int prot, int flags, int fd, long offset)
      throws LastErrorException;

  static native int munmap(long addr, long length) throws LastErrorException;

  static native int open(String path, int flags) throws LastErrorException;

  static native int close(int fd) throws LastErrorException;

  /** An anonymous file in memory (glibc 2.27+); other processes reach it as /proc/PID/fd/FD. */
  static native int memfd_create(String name, int flags) throws LastErrorException;

  static native int ftruncate(int fd, long length) throws LastErrorException;

  /** kill(pid, 0) asks only whether the process exists (ESRCH when not). */
  static native int kill(int pid, int signal) throws LastErrorException;

  /** fcntl with an integer argument (F_ADD_SEALS, F_GET_SEALS). */
  static native int fcntl(int fd, int cmd, long arg) throws LastErrorException;

  static native int madvise(long addr, long length, int advice) throws LastErrorException;

  /** ssize_t process_vm_writev(pid_t, const struct iovec *, unsigned long, same, unsigned long, flags). */
  static native long process_vm_writev(
      int pid, long localIov, long localCount, long remoteIov, long remoteCount, long flags)
      throws LastErrorException;

  static native long process_vm_readv(
      int pid, long localIov, long localCount, long remoteIov, long remoteCount, long flags)
      throws LastErrorException;

  static native String strerror(int errno);

  /** The symbolic name of the errno values the data plane meets, else {@code errno <n>}. */
  static String errnoName(int errno) {
    return switch (errno) {
      case EPERM -> "EPERM";
      case 2 -> "ENOENT";
      case ESRCH -> "ESRCH";
      case EINTR -> "EINTR";
      case 5 -> "EIO";
      case 11 -> "EAGAIN";
      case ENOMEM -> "ENOMEM";
      case 13 -> "EACCES";
      case EFAULT -> "EFAULT";
      case EINVAL -> "EINVAL";
      case ENOSYS -> "ENOSYS";
      default -> "errno " + errno;
    };
  }
}
