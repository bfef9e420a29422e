package dev.kvferry.rdma.ucx;

import com.sun.jna.Callback;
import com.sun.jna.Native;
import com.sun.jna.Pointer;
import org.jspecify.annotations.Nullable;

/**
 * The libucp calls of the ucx transport, through JNA's direct mapping (no reflection, no boxing:
 * handles, pointers and structs travel as {@code long} addresses). Not for use outside this package:
 * {@link Ucx} probes the library once and checks every return code.
 *
 * <p>Struct offsets and field-mask bits are those of UCX 1.13.1's {@code ucp/api/ucp.h} (Debian
 * bookworm's libucx-dev), printed with {@code offsetof} against those headers. Only fields present
 * since UCX 1.10 are used, and UCX only appends fields, so the layouts hold for every version
 * {@link Ucx} accepts.
 */
final class Ucp {
  static {
    Native.register(Ucp.class, UcxLibraries.load("ucp", "libucp.so.0"));
  }

  private Ucp() {}

  // ucs_status_t values (ucs/type/status.h).
  static final int UCS_OK = 0;
  static final int UCS_INPROGRESS = 1;
  static final int UCS_ERR_UNREACHABLE = -6;
  static final int UCS_ERR_BUSY = -15;
  /** Status pointers in [UCS_ERR_LAST, 0) are errors (UCS_PTR_IS_ERR). */
  static final int UCS_ERR_LAST = -100;

  // ucp_params_t (80 bytes): field_mask@0, features@8.
  static final int PARAMS_BYTES = 80;
  static final long PARAM_FIELD_FEATURES = 1L;
  static final long FEATURE_RMA = 1L << 1;
  static final long FEATURE_WAKEUP = 1L << 4;

  // ucp_worker_params_t (200 bytes): field_mask@0, thread_mode@8 (int).
  static final int WORKER_PARAMS_BYTES = 200;
  static final long WORKER_PARAM_FIELD_THREAD_MODE = 1L;
  static final int THREAD_MODE_SINGLE = 0;

  // ucp_ep_params_t (104 bytes): field_mask@0, address@8, err_mode@16 (int),
  // err_handler.cb@24, err_handler.arg@32.
  static final int EP_PARAMS_BYTES = 104;
  static final long EP_PARAM_FIELD_REMOTE_ADDRESS = 1L;
  static final long EP_PARAM_FIELD_ERR_HANDLING_MODE = 1L << 1;
  static final long EP_PARAM_FIELD_ERR_HANDLER = 1L << 2;
  static final int ERR_HANDLING_MODE_PEER = 1;

  // ucp_mem_map_params_t (40 bytes): field_mask@0, address@8, length@16, flags@24 (unsigned).
  static final int MEM_MAP_PARAMS_BYTES = 40;
  static final long MEM_MAP_PARAM_FIELD_ADDRESS = 1L;
  static final long MEM_MAP_PARAM_FIELD_LENGTH = 1L << 1;
  static final long MEM_MAP_PARAM_FIELD_FLAGS = 1L << 2;
  /** ucp_mem_map's flag: UCX allocates the memory (address NULL), where its peers reach it best. */
  static final int MEM_MAP_ALLOCATE = 1 << 1;

  // ucp_mem_attr_t (32 bytes): field_mask@0, address@8, length@16.
  static final int MEM_ATTR_BYTES = 32;
  static final long MEM_ATTR_FIELD_ADDRESS = 1L;
  static final long MEM_ATTR_FIELD_LENGTH = 1L << 1;

  // ucp_request_param_t (72 bytes): op_attr_mask@0 (uint32), flags@4 (uint32).
  static final int REQUEST_PARAM_BYTES = 72;
  static final int OP_ATTR_FIELD_FLAGS = 1 << 4;
  /** ucp_ep_close_flags_t: release the endpoint at once, failing what is outstanding. */
  static final int EP_CLOSE_FLAG_FORCE = 1;

  /** void (*ucp_err_handler_cb_t)(void *arg, ucp_ep_h ep, ucs_status_t status). */
  interface ErrorHandler extends Callback {
    void invoke(Pointer arg, Pointer ep, int status);
  }

  static native void ucp_get_version(int[] major, int[] minor, int[] release);

  static native int ucp_config_read(
      @Nullable Pointer envPrefix, @Nullable Pointer filename, long[] config);

  static native int ucp_config_modify(long config, String name, String value);

  static native void ucp_config_release(long config);

  static native int ucp_init_version(
      int apiMajor, int apiMinor, long params, long config, long[] context);

  static native void ucp_cleanup(long context);

  static native int ucp_worker_create(long context, long params, long[] worker);

  static native void ucp_worker_destroy(long worker);

  static native int ucp_worker_get_address(long worker, long[] address, long[] lengthBytes);

  static native void ucp_worker_release_address(long worker, long address);

  static native int ucp_worker_progress(long worker);

  static native int ucp_worker_get_efd(long worker, int[] fd);

  static native int ucp_worker_arm(long worker);

  static native int ucp_worker_signal(long worker);

  static native int ucp_ep_create(long worker, long params, long[] ep);

  static native long ucp_ep_close_nbx(long ep, long param);

  static native long ucp_ep_flush_nbx(long ep, long param);

  static native int ucp_mem_map(long context, long params, long[] memh);

  static native int ucp_mem_unmap(long context, long memh);

  static native int ucp_mem_query(long memh, long attr);

  static native int ucp_rkey_pack(long context, long memh, long[] buffer, long[] lengthBytes);

  static native void ucp_rkey_buffer_release(long buffer);

  static native int ucp_ep_rkey_unpack(long ep, long buffer, long[] rkey);

  static native void ucp_rkey_destroy(long rkey);

  static native long ucp_put_nbx(
      long ep, long buffer, long countBytes, long remoteAddress, long rkey, long param);

  static native long ucp_get_nbx(
      long ep, long buffer, long countBytes, long remoteAddress, long rkey, long param);

  static native int ucp_request_check_status(long request);

  static native void ucp_request_free(long request);

  /** UCS_PTR_IS_ERR: a status pointer that is an error code rather than a request or NULL. */
  static boolean isError(long statusPointer) {
    return statusPointer < 0 && statusPointer >= UCS_ERR_LAST;
  }
}
