package dev.kvferry.cli;

import picocli.CommandLine;
import picocli.CommandLine.Command;

/** The {@code kvferry} command: one entry point, one subcommand per job. */
@Command(
    name = "kvferry",
    mixinStandardHelpOptions = true,
    versionProvider = KvferryCli.Version.class,
    description = "Moves the KV cache of LLM requests from prefill to decode instances.",
    subcommands = {CommandLine.HelpCommand.class})
public final class KvferryCli implements Runnable {

  @CommandLine.Spec CommandLine.Model.CommandSpec spec;

  public static void main(String[] args) {
    System.exit(newCommandLine().execute(args));
  }

  /** Builds the command line with every subcommand registered; tests call this too. */
  public static CommandLine newCommandLine() {
    CommandLine cli = new CommandLine(new KvferryCli());
    // Subcommands are registered here, one line each.
    cli.addSubcommand(new PlanCommand());
    cli.addSubcommand(new NodeCommand());
    cli.addSubcommand(new RouterCommand());
    cli.addSubcommand(new DemoCommand());
    cli.addSubcommand(new StatusCommand());
    cli.addSubcommand(new CdsWarmupCommand());
    cli.addSubcommand(new BenchCommand());
    return cli;
  }

  @Override
  public void run() {
    spec.commandLine().usage(System.out);
  }

  static final class Version implements CommandLine.IVersionProvider {
    @Override
    public String[] getVersion() {
      String v = KvferryCli.class.getPackage().getImplementationVersion();
      return new String[] {"kvferry " + (v == null ? "dev" : v)};
    }
  }
}
