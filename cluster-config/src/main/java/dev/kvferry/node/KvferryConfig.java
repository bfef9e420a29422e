package dev.kvferry.node;

import com.typesafe.config.Config;
import com.typesafe.config.ConfigFactory;
import java.util.Map;

/**
 * Loads a kvferry process's config: flags over the user's application.conf (and -D properties)
 * over kvferry's Pekko settings (kvferry-pekko.conf) over every library's reference.conf. Pekko
 * settings live in their own file because in a shaded jar the order in which reference.conf files
 * are concatenated is not defined, so ours could lose to Pekko's own defaults.
 */
public final class KvferryConfig {
  private KvferryConfig() {}

  public static Config load(Map<String, ?> overrides) {
    ConfigFactory.invalidateCaches();
    return ConfigFactory.systemProperties()
        .withFallback(ConfigFactory.parseMap(overrides))
        .withFallback(ConfigFactory.defaultApplication())
        .withFallback(ConfigFactory.parseResources("kvferry-pekko.conf"))
        .withFallback(ConfigFactory.defaultReference())
        .resolve();
  }
}
