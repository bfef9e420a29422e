package dev.kvferry.rdma.ucx;

import org.jspecify.annotations.Nullable;

/**
 * kvferry's entry to UCX: the availability probe (libucp loads and is at least {@link
 * #MIN_MAJOR}.{@link #MIN_MINOR}) and the status checks every call goes through.
 */
public final class Ucx {

  /** The oldest UCX whose API has everything used here (the nbx calls, ucp_request_param_t). */
  public static final int MIN_MAJOR = 1;

  public static final int MIN_MINOR = 10;

  private static final @Nullable String UNAVAILABLE;
  private static final String VERSION;

  static {
    String reason = null;
    String version = "";
    try {
      // Before anything else of UCX: the JVM, not UCX, handles SIGSEGV and friends.
      Ucs.ucs_debug_disable_signals();
      int st = Ucs.ucs_global_opts_set_value("ERROR_SIGNALS", "");
      if (st != Ucp.UCS_OK) {
        throw new UcxException("ucs_global_opts_set_value(ERROR_SIGNALS)", st, Ucs.ucs_status_string(st));
      }
      int[] major = new int[1];
      int[] minor = new int[1];
      int[] release = new int[1];
      Ucp.ucp_get_version(major, minor, release);
      version = major[0] + "." + minor[0] + "." + release[0];
      if (major[0] < MIN_MAJOR || (major[0] == MIN_MAJOR && minor[0] < MIN_MINOR)) {
        reason = "libucp " + version + " is older than " + MIN_MAJOR + "." + MIN_MINOR
            + ", the oldest with the calls kvferry uses";
      }
    } catch (UnsatisfiedLinkError | NoClassDefFoundError e) {
      String m = e.getMessage() == null ? e.toString() : e.getMessage().lines().findFirst().orElse("");
      reason = "libucp could not be loaded (" + m + "); install it (Debian: apt-get install libucx0)";
    } catch (RuntimeException | ExceptionInInitializerError e) {
      Throwable cause = e.getCause() != null ? e.getCause() : e;
      reason = "libucp could not be loaded: " + cause;
    }
    UNAVAILABLE = reason;
    VERSION = version;
  }

  private Ucx() {}

  /** True when libucp loads and is recent enough. */
  public static boolean available() {
    return UNAVAILABLE == null;
  }

  /** Why UCX is unavailable, or null when it is available. */
  public static @Nullable String unavailableReason() {
    return UNAVAILABLE;
  }

  /** The loaded libucp's version, e.g. {@code 1.13.1}, or "" when it did not load. */
  public static String version() {
    return VERSION;
  }

  /** @throws UcxUnavailableException with the probe's reason unless {@link #available()} */
  public static void require() {
    if (UNAVAILABLE != null) {
      throw new UcxUnavailableException(UNAVAILABLE);
    }
  }

  /** @throws UcxException naming {@code call} unless {@code status} is UCS_OK */
  static void check(int status, String call) {
    if (status != Ucp.UCS_OK) {
      throw new UcxException(call, status, statusText(status));
    }
  }

  /**
   * Runs {@code call} with UCX's log quiet (fatal only): for an attempt whose failure kvferry
   * handles itself, so UCX's own ERROR line (which it writes to stdout) would only mislead.
   */
  static int quietly(java.util.function.IntSupplier call) {
    byte[] saved = new byte[64];
    boolean known = Ucs.ucs_global_opts_get_value("LOG_LEVEL", saved, saved.length) == Ucp.UCS_OK;
    Ucs.ucs_global_opts_set_value("LOG_LEVEL", "fatal");
    try {
      return call.getAsInt();
    } finally {
      String level = known ? com.sun.jna.Native.toString(saved) : "warn";
      Ucs.ucs_global_opts_set_value("LOG_LEVEL", level.isEmpty() ? "warn" : level);
    }
  }

  /** The library's text for a status, e.g. {@code Connection reset by remote peer}. */
  public static String statusText(int status) {
    String s = Ucs.ucs_status_string(status);
    return s == null ? "status " + status : s;
  }
}
