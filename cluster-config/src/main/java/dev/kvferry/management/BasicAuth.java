package dev.kvferry.management;

import com.typesafe.config.Config;
import java.util.Optional;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionStage;
import org.apache.pekko.http.javadsl.server.directives.SecurityDirectives.ProvidedCredentials;

/**
 * Optional HTTP basic auth in front of every management route, from {@code
 * kvferry.management.basic-auth}: one user name and password, off while the user name is empty.
 * Basic auth sends the password with every request: use it with TLS or on a private network.
 */
record BasicAuth(String username, String password) {

  private static final String PATH = "kvferry.management.basic-auth";

  static Optional<BasicAuth> fromConfig(Config root) {
    if (!root.hasPath(PATH + ".username") || root.getString(PATH + ".username").isEmpty()) {
      return Optional.empty();
    }
    String password = root.getString(PATH + ".password");
    if (password.isEmpty()) {
      throw new IllegalArgumentException(
          PATH + ".username is set but " + PATH + ".password is empty: set both, or neither");
    }
    return Optional.of(new BasicAuth(root.getString(PATH + ".username"), password));
  }

  /** Pekko Management's authenticator: the user name when the credentials match, else empty. */
  CompletionStage<Optional<String>> check(Optional<ProvidedCredentials> credentials) {
    boolean ok =
        credentials.isPresent()
            && credentials.get().identifier().equals(username)
            && credentials.get().verify(password); // constant-time comparison
    return CompletableFuture.completedFuture(ok ? Optional.of(username) : Optional.empty());
  }

  @Override
  public String toString() {
    return "BasicAuth[" + username + ", password hidden]"; // never log the password
  }
}
