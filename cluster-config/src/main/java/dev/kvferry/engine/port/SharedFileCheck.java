package dev.kvferry.engine.port;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.InvalidPathException;
import java.nio.file.LinkOption;
import java.nio.file.Path;
import java.nio.file.attribute.PosixFileAttributes;
import java.nio.file.attribute.PosixFilePermission;
import java.util.EnumSet;
import java.util.Set;

/**
 * Checks a file an engine shares its KV cache through before the node maps it: a regular file
 * (no symlink), owned by the node's user, with no access for group or others. A node maps only
 * what its own user made private, so a port client cannot point it at someone else's memory.
 */
final class SharedFileCheck {

  private static final Set<PosixFilePermission> OTHERS =
      EnumSet.of(PosixFilePermission.GROUP_READ, PosixFilePermission.GROUP_WRITE,
          PosixFilePermission.GROUP_EXECUTE, PosixFilePermission.OTHERS_READ,
          PosixFilePermission.OTHERS_WRITE, PosixFilePermission.OTHERS_EXECUTE);

  private SharedFileCheck() {}

  static Path check(String name) throws PortException {
    Path path;
    try {
      path = Path.of(name);
    } catch (InvalidPathException e) {
      throw new PortException(PortError.BAD_MEMORY, "not a path: " + name);
    }
    if (!path.isAbsolute()) {
      throw new PortException(PortError.BAD_MEMORY, name + " is not an absolute path");
    }
    PosixFileAttributes attrs;
    try {
      attrs = Files.readAttributes(path, PosixFileAttributes.class, LinkOption.NOFOLLOW_LINKS);
    } catch (IOException e) {
      throw new PortException(PortError.BAD_MEMORY, "cannot read " + name + ": " + e);
    }
    if (!attrs.isRegularFile()) {
      throw new PortException(PortError.BAD_MEMORY, name + " is not a regular file");
    }
    String me = System.getProperty("user.name");
    if (!attrs.owner().getName().equals(me)) {
      throw new PortException(PortError.BAD_MEMORY,
          name + " is owned by " + attrs.owner().getName() + ", not by the node's user " + me);
    }
    Set<PosixFilePermission> open = EnumSet.noneOf(PosixFilePermission.class);
    open.addAll(attrs.permissions());
    open.retainAll(OTHERS);
    if (!open.isEmpty()) {
      throw new PortException(PortError.BAD_MEMORY,
          name + " is open to group or others (" + open + "); create it with mode 0600");
    }
    return path;
  }
}
