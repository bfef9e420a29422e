package dev.kvferry.cli;

import org.apache.pekko.actor.typed.ActorSystem;
import org.apache.pekko.management.javadsl.PekkoManagement;

/** Starts Pekko Management HTTP (bound per pekko.management.http.*) for a process. */
final class ManagementStarter {
  private ManagementStarter() {}

  static void start(ActorSystem<?> system) {
    PekkoManagement.get(system.classicSystem()).start();
  }
}
