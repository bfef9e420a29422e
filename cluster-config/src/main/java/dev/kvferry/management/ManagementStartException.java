package dev.kvferry.management;

/** The management HTTP server could not start: usually its port is taken. */
public final class ManagementStartException extends Exception {
  private static final long serialVersionUID = 1L;

  public ManagementStartException(String hostPort, String reason, Throwable cause) {
    super(
        "cannot start management HTTP on " + hostPort + ": " + reason
            + "; choose another port with --management-port or pekko.management.http.port",
        cause);
  }
}
