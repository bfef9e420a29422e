package dev.kvferry.rdma;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import org.jspecify.annotations.Nullable;

/**
 * How another process on this host maps the pages of a host region itself: the region is the
 * start of a sealed memfd that its owner keeps open as descriptor {@code fd}, so a peer opens
 * {@code /proc/<pid>/fd/<fd>} and checks that it got that very file ({@code device}, {@code
 * inode}: a closed and reused descriptor number names another file). The file is sealed against
 * shrinking, so a peer's mapping can never fault past its end.
 *
 * @param fd the owner's descriptor of the file
 * @param device the file's device number (stat st_dev)
 * @param inode the file's inode number (stat st_ino)
 */
public record SharedPages(int fd, long device, long inode) {

  public SharedPages {
    if (fd < 0) {
      throw new IllegalArgumentException("shared pages need a file descriptor, got " + fd);
    }
  }

  /** Our own descriptor {@code fd} with the identity (device, inode) of the file it names. */
  static SharedPages ofOwnDescriptor(int fd) throws IOException {
    Path self = Path.of("/proc/self/fd/" + fd);
    long device = ((Number) Files.getAttribute(self, "unix:dev")).longValue();
    long inode = ((Number) Files.getAttribute(self, "unix:ino")).longValue();
    return new SharedPages(fd, device, inode);
  }

  // Written out: the record's generated ones go through method handles, slow before the JIT
  // compiled them; a PeerMappings key holds these, looked up per copy.
  @Override
  public int hashCode() {
    return (31 * fd + Long.hashCode(device)) * 31 + Long.hashCode(inode);
  }

  @Override
  public boolean equals(@Nullable Object o) {
    return o instanceof SharedPages p && fd == p.fd && device == p.device && inode == p.inode;
  }

  /** Whether {@code other} names the same file (the descriptor numbers may differ). */
  boolean sameFile(SharedPages other) {
    return device == other.device && inode == other.inode;
  }

  /** The path under which a process on this host opens the owner's file. */
  public String procPath(long ownerPid) {
    return "/proc/" + ownerPid + "/fd/" + fd;
  }
}
