package dev.kvferry.rdma;

import java.io.IOException;
import java.util.Arrays;
import java.util.HexFormat;
import java.util.Objects;
import org.msgpack.core.MessageBufferPacker;
import org.msgpack.core.MessagePack;
import org.jspecify.annotations.Nullable;
import org.msgpack.core.MessageUnpacker;

/**
 * What a peer needs to reach a registered region: its identity and bounds, plus what each transport
 * needs (process id for CMA, endpoint and token for TCP, IPC handle for CUDA). Packed with
 * msgpack-core as a map with stable field names so other languages can read it.
 *
 * @param regionId id of the region in its owner's registry
 * @param lengthBytes registered length; no transfer may reach past it
 * @param kind host or device memory
 * @param device GPU index for CUDA regions, -1 for host memory
 * @param owner the owner's name (engine id), for error messages
 * @param pid process id of the owner (CMA)
 * @param baseAddress virtual address of the region in the owner's process (CMA)
 * @param bootId the owner's kernel boot id; CMA only works when it equals ours (same host)
 * @param tcpHost host of the owner's TCP data listener, or "" when it has none
 * @param tcpPort port of the owner's TCP data listener, or 0
 * @param token secret a TCP connection must present before any byte is accepted
 * @param cudaIpcHandle CUDA IPC memory handle (64 bytes) for CUDA regions, else empty
 * @param ucxWorkerAddress the owner's UCX worker address (ucp_worker_get_address), else empty
 * @param ucxRkey the region's packed UCX remote key (ucp_rkey_pack), else empty
 * @param sharedPages how a cma peer maps the region's pages itself, or null (it then uses the
 *     system calls)
 */
public record RegionDescriptor(
    int regionId,
    long lengthBytes,
    RegionKind kind,
    int device,
    String owner,
    long pid,
    long baseAddress,
    String bootId,
    String tcpHost,
    int tcpPort,
    byte[] token,
    byte[] cudaIpcHandle,
    byte[] ucxWorkerAddress,
    byte[] ucxRkey,
    @Nullable SharedPages sharedPages) {

  /** Upper bound on a packed descriptor; anything larger is refused unread. */
  public static final int MAX_PACKED_BYTES = 4096;

  private static final int MAX_SECRET_BYTES = 256;

  /** Bound of each UCX field: a worker address grows with the devices it lists. */
  public static final int MAX_UCX_BYTES = 2048;

  public RegionDescriptor {
    Objects.requireNonNull(kind, "kind");
    owner = owner == null ? "" : owner;
    bootId = bootId == null ? "" : bootId;
    tcpHost = tcpHost == null ? "" : tcpHost;
    token = token == null ? new byte[0] : token;
    cudaIpcHandle = cudaIpcHandle == null ? new byte[0] : cudaIpcHandle;
    ucxWorkerAddress = ucxWorkerAddress == null ? new byte[0] : ucxWorkerAddress;
    ucxRkey = ucxRkey == null ? new byte[0] : ucxRkey;
    if (lengthBytes < 0) {
      throw new IllegalArgumentException("region " + regionId + ": negative length " + lengthBytes);
    }
  }

  /** A descriptor without shared pages. */
  public RegionDescriptor(
      int regionId,
      long lengthBytes,
      RegionKind kind,
      int device,
      String owner,
      long pid,
      long baseAddress,
      String bootId,
      String tcpHost,
      int tcpPort,
      byte[] token,
      byte[] cudaIpcHandle,
      byte[] ucxWorkerAddress,
      byte[] ucxRkey) {
    this(regionId, lengthBytes, kind, device, owner, pid, baseAddress, bootId, tcpHost, tcpPort,
        token, cudaIpcHandle, ucxWorkerAddress, ucxRkey, null);
  }

  /** A descriptor without UCX fields (the form before the ucx transport). */
  public RegionDescriptor(
      int regionId,
      long lengthBytes,
      RegionKind kind,
      int device,
      String owner,
      long pid,
      long baseAddress,
      String bootId,
      String tcpHost,
      int tcpPort,
      byte[] token,
      byte[] cudaIpcHandle) {
    this(regionId, lengthBytes, kind, device, owner, pid, baseAddress, bootId, tcpHost, tcpPort,
        token, cudaIpcHandle, new byte[0], new byte[0], null);
  }

  /** Same descriptor with the TCP endpoint and token filled in. */
  public RegionDescriptor withTcp(String host, int port, byte[] newToken) {
    return new RegionDescriptor(
        regionId, lengthBytes, kind, device, owner, pid, baseAddress, bootId, host, port, newToken,
        cudaIpcHandle, ucxWorkerAddress, ucxRkey, sharedPages);
  }

  /** Same descriptor with a CUDA IPC handle. */
  public RegionDescriptor withCudaIpcHandle(byte[] handle) {
    return new RegionDescriptor(
        regionId, lengthBytes, kind, device, owner, pid, baseAddress, bootId, tcpHost, tcpPort,
        token, handle, ucxWorkerAddress, ucxRkey, sharedPages);
  }

  /** Same descriptor with the owner's UCX worker address and the region's packed remote key. */
  public RegionDescriptor withUcx(byte[] workerAddress, byte[] rkey) {
    return new RegionDescriptor(
        regionId, lengthBytes, kind, device, owner, pid, baseAddress, bootId, tcpHost, tcpPort,
        token, cudaIpcHandle, workerAddress, rkey, sharedPages);
  }

  /** Same descriptor with (or, given null, without) the region's shared pages. */
  public RegionDescriptor withSharedPages(@Nullable SharedPages pages) {
    return new RegionDescriptor(
        regionId, lengthBytes, kind, device, owner, pid, baseAddress, bootId, tcpHost, tcpPort,
        token, cudaIpcHandle, ucxWorkerAddress, ucxRkey, pages);
  }

  /**
   * Checks that {@code [offsetBytes, offsetBytes + lengthBytes)} lies inside this region.
   *
   * @throws RegionBoundsException naming the region, owner and range when it does not
   */
  public void checkRange(long offsetBytes, long length) {
    MemoryRegion.checkRange(regionId, owner, this.lengthBytes, offsetBytes, length);
  }

  /**
   * Packs this descriptor for the control plane. Strings travel as UTF-8.
   *
   * @throws IllegalArgumentException when the result would exceed {@link #MAX_PACKED_BYTES} or a
   *     token or handle exceeds the 256 bytes {@link #unpack} accepts, or a UCX field the {@link
   *     #MAX_UCX_BYTES}. The UCX fields are packed only when set, so descriptors of the other
   *     transports keep the form older peers read.
   */
  public byte[] pack() {
    if (token.length > MAX_SECRET_BYTES || cudaIpcHandle.length > MAX_SECRET_BYTES) {
      throw new IllegalArgumentException(
          "descriptor of region " + regionId + ": token or CUDA IPC handle over "
              + MAX_SECRET_BYTES + " bytes");
    }
    if (ucxWorkerAddress.length > MAX_UCX_BYTES || ucxRkey.length > MAX_UCX_BYTES) {
      throw new IllegalArgumentException(
          "descriptor of region " + regionId + ": UCX worker address or remote key over "
              + MAX_UCX_BYTES + " bytes");
    }
    boolean ucx = ucxWorkerAddress.length > 0 || ucxRkey.length > 0;
    try (MessageBufferPacker p = MessagePack.newDefaultBufferPacker()) {
      p.packMapHeader(12 + (ucx ? 2 : 0) + (sharedPages != null ? 3 : 0));
      p.packString("region_id").packInt(regionId);
      p.packString("length").packLong(lengthBytes);
      p.packString("kind").packString(kind.name());
      p.packString("device").packInt(device);
      p.packString("owner").packString(owner);
      p.packString("pid").packLong(pid);
      p.packString("base_addr").packLong(baseAddress);
      p.packString("boot_id").packString(bootId);
      p.packString("tcp_host").packString(tcpHost);
      p.packString("tcp_port").packInt(tcpPort);
      p.packString("token").packBinaryHeader(token.length).writePayload(token);
      p.packString("cuda_ipc_handle")
          .packBinaryHeader(cudaIpcHandle.length)
          .writePayload(cudaIpcHandle);
      if (ucx) {
        p.packString("ucx_worker_address")
            .packBinaryHeader(ucxWorkerAddress.length)
            .writePayload(ucxWorkerAddress);
        p.packString("ucx_rkey").packBinaryHeader(ucxRkey.length).writePayload(ucxRkey);
      }
      if (sharedPages != null) {
        p.packString("shm_fd").packInt(sharedPages.fd());
        p.packString("shm_dev").packLong(sharedPages.device());
        p.packString("shm_ino").packLong(sharedPages.inode());
      }
      byte[] packed = p.toByteArray();
      if (packed.length > MAX_PACKED_BYTES) {
        // A peer would refuse it unread; fail here, where the oversized field is known.
        throw new IllegalArgumentException(
            "descriptor of region " + regionId + " packs to " + packed.length + " bytes, over "
                + MAX_PACKED_BYTES + " (owner, host or handle too long?)");
      }
      return packed;
    } catch (IOException e) {
      throw new IllegalStateException("packing descriptor of region " + regionId, e);
    }
  }

  /**
   * Reads a packed descriptor.
   *
   * @throws MalformedDescriptorException when the bytes are not a descriptor (garbage, truncated,
   *     wrong types, missing fields); never anything else
   */
  public static RegionDescriptor unpack(byte[] packed) throws MalformedDescriptorException {
    if (packed == null || packed.length == 0) {
      throw new MalformedDescriptorException("empty region descriptor");
    }
    if (packed.length > MAX_PACKED_BYTES) {
      throw new MalformedDescriptorException(
          "region descriptor of " + packed.length + " bytes exceeds " + MAX_PACKED_BYTES);
    }
    Integer regionId = null;
    Long length = null;
    RegionKind kind = null;
    int device = -1;
    String owner = "";
    long pid = 0;
    long base = 0;
    String bootId = "";
    String tcpHost = "";
    int tcpPort = 0;
    byte[] token = new byte[0];
    byte[] ipc = new byte[0];
    byte[] ucxAddress = new byte[0];
    byte[] ucxRkey = new byte[0];
    Integer shmFd = null;
    Long shmDev = null;
    Long shmIno = null;
    try (MessageUnpacker u = MessagePack.newDefaultUnpacker(packed)) {
      int fields = u.unpackMapHeader();
      if (fields > 64) {
        throw new MalformedDescriptorException("region descriptor claims " + fields + " fields");
      }
      for (int i = 0; i < fields; i++) {
        String key = u.unpackString();
        switch (key) {
          case "region_id" -> regionId = u.unpackInt();
          case "length" -> length = u.unpackLong();
          case "kind" -> kind = parseKind(u.unpackString());
          case "device" -> device = u.unpackInt();
          case "owner" -> owner = u.unpackString();
          case "pid" -> pid = u.unpackLong();
          case "base_addr" -> base = u.unpackLong();
          case "boot_id" -> bootId = u.unpackString();
          case "tcp_host" -> tcpHost = u.unpackString();
          case "tcp_port" -> tcpPort = u.unpackInt();
          case "token" -> token = readBinary(u, MAX_SECRET_BYTES, "token");
          case "cuda_ipc_handle" -> ipc = readBinary(u, MAX_SECRET_BYTES, "cuda_ipc_handle");
          case "ucx_worker_address" -> ucxAddress = readBinary(u, MAX_UCX_BYTES, "ucx_worker_address");
          case "ucx_rkey" -> ucxRkey = readBinary(u, MAX_UCX_BYTES, "ucx_rkey");
          case "shm_fd" -> shmFd = u.unpackInt();
          case "shm_dev" -> shmDev = u.unpackLong();
          case "shm_ino" -> shmIno = u.unpackLong();
          default -> u.skipValue(); // newer peers may add fields
        }
      }
      if (u.hasNext()) {
        throw new MalformedDescriptorException("trailing bytes after region descriptor");
      }
    } catch (MalformedDescriptorException e) {
      throw e;
    } catch (IOException | RuntimeException e) {
      throw new MalformedDescriptorException("malformed region descriptor: " + e.getMessage());
    }
    if (regionId == null || length == null || kind == null) {
      throw new MalformedDescriptorException(
          "region descriptor lacks a required field (region_id, length, kind)");
    }
    if (length < 0 || tcpPort < 0 || tcpPort > 65535) {
      throw new MalformedDescriptorException(
          "region descriptor has out-of-range values: length=" + length + " tcp_port=" + tcpPort);
    }
    SharedPages shared = null;
    if (shmFd != null || shmDev != null || shmIno != null) {
      if (shmFd == null || shmDev == null || shmIno == null || shmFd < 0) {
        throw new MalformedDescriptorException(
            "region descriptor's shared pages need shm_fd >= 0, shm_dev and shm_ino, got fd="
                + shmFd + " dev=" + shmDev + " ino=" + shmIno);
      }
      shared = new SharedPages(shmFd, shmDev, shmIno);
    }
    return new RegionDescriptor(
        regionId, length, kind, device, owner, pid, base, bootId, tcpHost, tcpPort, token, ipc,
        ucxAddress, ucxRkey, shared);
  }

  private static RegionKind parseKind(String s) throws MalformedDescriptorException {
    try {
      return RegionKind.valueOf(s);
    } catch (IllegalArgumentException e) {
      throw new MalformedDescriptorException("unknown region kind '" + s + "'");
    }
  }

  private static byte[] readBinary(MessageUnpacker u, int max, String field)
      throws IOException, MalformedDescriptorException {
    int n = u.unpackBinaryHeader();
    if (n < 0 || n > max) {
      throw new MalformedDescriptorException(field + " of " + n + " bytes exceeds " + max);
    }
    return u.readPayload(n);
  }

  @Override
  public boolean equals(Object o) {
    return o instanceof RegionDescriptor d
        && regionId == d.regionId
        && lengthBytes == d.lengthBytes
        && kind == d.kind
        && device == d.device
        && owner.equals(d.owner)
        && pid == d.pid
        && baseAddress == d.baseAddress
        && bootId.equals(d.bootId)
        && tcpHost.equals(d.tcpHost)
        && tcpPort == d.tcpPort
        && Arrays.equals(token, d.token)
        && Arrays.equals(cudaIpcHandle, d.cudaIpcHandle)
        && Arrays.equals(ucxWorkerAddress, d.ucxWorkerAddress)
        && Arrays.equals(ucxRkey, d.ucxRkey)
        && Objects.equals(sharedPages, d.sharedPages);
  }

  @Override
  public int hashCode() {
    return Objects.hash(regionId, lengthBytes, kind, device, owner, pid, baseAddress, tcpPort);
  }

  @Override
  public String toString() {
    // The token is a secret: never print it.
    return "RegionDescriptor[region="
        + regionId
        + ", owner="
        + owner
        + ", kind="
        + kind
        + ", length="
        + lengthBytes
        + ", pid="
        + pid
        + ", base=0x"
        + HexFormat.of().toHexDigits(baseAddress)
        + (tcpPort > 0 ? ", tcp=" + tcpHost + ":" + tcpPort : "")
        + (ucxWorkerAddress.length > 0 ? ", ucx worker address of " + ucxWorkerAddress.length + " bytes" : "")
        + (sharedPages != null ? ", shared fd " + sharedPages.fd() : "")
        + "]";
  }
}
