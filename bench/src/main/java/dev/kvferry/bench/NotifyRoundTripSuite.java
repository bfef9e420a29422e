package dev.kvferry.bench;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import dev.kvferry.actors.EngineActor;
import dev.kvferry.actors.PeerProtocol;
import dev.kvferry.rdma.testing.ChildJvm;
import java.io.IOException;
import java.io.PrintStream;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Set;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import org.apache.pekko.actor.typed.ActorRef;
import org.apache.pekko.actor.typed.ActorSystem;
import org.apache.pekko.actor.typed.Behavior;
import org.apache.pekko.actor.typed.javadsl.AskPattern;
import org.apache.pekko.actor.typed.javadsl.Behaviors;
import org.apache.pekko.actor.typed.receptionist.Receptionist;

/**
 * The notify round trip between two cluster nodes in two JVMs: the decode side (this JVM) sends
 * {@link PeerProtocol.RemoteBlocks} with 64 block ids to the prefill side ({@link NotifyEcho}, a
 * child JVM), which answers with {@link PeerProtocol.WriteDone}; both are written by kvferry's
 * PeerMessageSerializer and go over Artery TCP on loopback, actor to actor. One round trip at a
 * time, like the seed script, which does the same with pyzmq DEALER/ROUTER sockets and msgpack
 * (kvferry's peer seed_notify_rtt.py). The time is taken in the sending actor, from the tell to
 * the reply's handling.
 */
public final class NotifyRoundTripSuite {

  /** DESIGN section 7: p50 at most the seed stack's (seed / kvferry >= 1), p99 at most 1.5x it. */
  public static final double GOAL = 1.0;

  public static final double P99_GOAL = 1 / 1.5;
  public static final int BLOCKS_PER_MESSAGE = 64;

  /**
   * kvferry's warm-up lasts at least this long (and the seed's round-trip count): a fresh JVM
   * spends its first seconds compiling Pekko's and Jackson's paths (JFR: the C2 threads took 39%
   * of the decode JVM's CPU over a 12,000-round-trip run), which a long-running node has behind it.
   */
  public static final long WARMUP_NANOS = 10_000_000_000L;

  private final PeerTools peers;
  private final int roundTrips;
  private final long warmupNanos;
  private final PrintStream progress;

  /** kvferry warmed up for {@link #WARMUP_NANOS}, as for the published figures. */
  public NotifyRoundTripSuite(PeerTools peers, int roundTrips, PrintStream progress) {
    this(peers, roundTrips, WARMUP_NANOS, progress);
  }

  public NotifyRoundTripSuite(
      PeerTools peers, int roundTrips, long warmupNanos, PrintStream progress) {
    this.peers = peers;
    this.roundTrips = roundTrips;
    this.warmupNanos = warmupNanos;
    this.progress = progress;
  }

  /** Round-trip times in microseconds after the warm-up. */
  public record Latency(double p50Us, double p99Us, double decodeCpuUs) {}

  public List<BenchRow> run() {
    Latency seed = null;
    String note = "";
    try {
      progress.printf("  notify round trip, seed stack (pyzmq + msgpack), %,d round trips%n",
          roundTrips);
      seed = seed();
    } catch (PeerTools.MissingPeerException e) {
      note = e.getMessage();
    } catch (IOException | RuntimeException e) {
      note = "seed_notify_rtt.py failed: " + e.getMessage();
    }
    Latency kv = null;
    String failure = null;
    try {
      progress.printf("  notify round trip, kvferry (Artery, two JVMs), %,d round trips%n",
          roundTrips);
      kv = kvferry(roundTrips, warmup(roundTrips), warmupNanos);
    } catch (IOException | RuntimeException e) {
      failure = "kvferry round trip failed: " + e;
    }
    String what = "RemoteBlocks (64 ids) then WriteDone, actor to actor across two JVMs"
        + (kv == null ? "" : String.format(java.util.Locale.ROOT,
            "; decode JVM CPU %.0f us per round trip", kv.decodeCpuUs()));
    BenchRow p50 =
        BenchRow.lowerIsBetter("notify round trip p50", "us", kv == null ? null : kv.p50Us(),
            seed == null ? null : seed.p50Us(), GOAL, note.isEmpty() ? what : note);
    BenchRow p99 =
        BenchRow.lowerIsBetter("notify round trip p99", "us", kv == null ? null : kv.p99Us(),
            seed == null ? null : seed.p99Us(), P99_GOAL, "");
    return failure == null ? List.of(p50, p99)
        : List.of(p50.failedBecause(failure), p99.failedBecause(failure));
  }

  /** The seed script's own warm-up: min(2000, n / 5). */
  private static int warmup(int roundTrips) {
    return Math.min(2000, roundTrips / 5);
  }

  private Latency seed() throws PeerTools.MissingPeerException, IOException {
    String python = peers.pythonWithZmq();
    PeerTools.Output o = PeerTools.run(
        List.of(python, peers.peerFile("seed_notify_rtt.py").toString(),
            String.valueOf(roundTrips), String.valueOf(BLOCKS_PER_MESSAGE)),
        null, Duration.ofMinutes(5));
    if (o.exitCode() != 0) {
      throw new IOException("exit " + o.exitCode() + ": " + o.stderr().strip());
    }
    JsonNode j = new ObjectMapper().readTree(o.lastLine());
    return new Latency(j.get("p50_us").asDouble(), j.get("p99_us").asDouble(), Double.NaN);
  }

  /** Runs the round trips with this JVM as the decode side and a child JVM as the prefill side. */
  public static Latency kvferry(int roundTrips, int warmup, long warmupNanos)
      throws IOException {
    int decodePort = dev.kvferry.node.FreePorts.next();
    int prefillPort = dev.kvferry.node.FreePorts.next();
    ActorSystem<Void> system = ActorSystem.create(Behaviors.empty(), NotifyEcho.SYSTEM_NAME,
        BenchCluster.nodeConfig(NotifyEcho.SYSTEM_NAME, decodePort, decodePort));
    List<String> childOptions = new ArrayList<>(List.of("-Xmx256m"));
    // JIT and GC flags (-XX:) and Pekko settings (-Dpekko.) given to this JVM apply to both sides.
    java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments().stream()
        .filter(a -> a.startsWith("-XX:") && !a.contains("FlightRecording"))
        .forEach(childOptions::add);
    System.getProperties().stringPropertyNames().stream()
        .filter(k -> k.startsWith("pekko."))
        .sorted()
        .forEach(k -> childOptions.add("-D" + k + "=" + System.getProperty(k)));
    try (ChildJvm echo = ChildJvm.start(NotifyEcho.class.getName(), childOptions,
        List.of(String.valueOf(prefillPort), String.valueOf(decodePort)))) {
      CompletableFuture<Measured> measured = new CompletableFuture<>();
      ActorRef<Object> pinger = system.systemActorOf(Pinger.create(), "notify-pinger",
          org.apache.pekko.actor.typed.Props.empty());
      system.receptionist().tell(Receptionist.register(NotifyEcho.DECODE_KEY, pinger.narrow()));
      echo.awaitLine("READY", Duration.ofSeconds(60));
      ActorRef<EngineActor.Command> prefill;
      try {
        prefill = awaitPrefill(system, Duration.ofSeconds(60));
      } catch (IOException e) {
        throw new IOException(e.getMessage() + "; its stderr ends with: " + echo.stderrTail(), e);
      }
      int[] blocks = new int[BLOCKS_PER_MESSAGE];
      for (int i = 0; i < blocks.length; i++) {
        blocks[i] = 1000 + i;
      }
      pinger.tell(new Start(prefill, blocks, warmup, warmupNanos, roundTrips, measured));
      Measured m = measured.get(10, TimeUnit.MINUTES);
      // -Dkvferry.notify.samples-file=F: each measured round trip with when it was sent.
      SamplesFile.appendIfAsked("kvferry.notify.samples-file", "sent at ns,round trip us",
          m.sentAtNanos(), i -> String.valueOf(m.samplesUs()[i]));
      return new Latency(Samples.percentile(m.samplesUs(), 50), Samples.percentile(m.samplesUs(), 99),
          m.cpuUsPerRoundTrip());
    } catch (Exception e) {
      throw e instanceof IOException io ? io : new IOException(e.toString(), e);
    } finally {
      system.terminate();
      try {
        system.getWhenTerminated().toCompletableFuture().get(20, TimeUnit.SECONDS);
      } catch (Exception ignored) {
        // leaving: a slow shutdown does not change the figures
      }
    }
  }

  private static ActorRef<EngineActor.Command> awaitPrefill(ActorSystem<Void> system,
      Duration timeout) throws IOException {
    long deadline = System.nanoTime() + timeout.toNanos();
    while (System.nanoTime() < deadline) {
      try {
        Receptionist.Listing l = AskPattern.<Receptionist.Command, Receptionist.Listing>ask(
                system.receptionist(), r -> Receptionist.find(NotifyEcho.PREFILL_KEY, r),
                Duration.ofSeconds(3), system.scheduler())
            .toCompletableFuture().get(5, TimeUnit.SECONDS);
        Set<ActorRef<EngineActor.Command>> found = l.getServiceInstances(NotifyEcho.PREFILL_KEY);
        if (!found.isEmpty()) {
          return found.iterator().next();
        }
        Thread.sleep(100);
      } catch (Exception e) {
        if (e instanceof InterruptedException) {
          Thread.currentThread().interrupt();
          throw new IOException("interrupted", e);
        }
      }
    }
    throw new IOException("the prefill side of the round trip did not join within " + timeout);
  }

  /** Local only: start the round trips. */
  private record Start(ActorRef<EngineActor.Command> prefill, int[] blockIds, int warmup,
      long warmupNanos, int roundTrips, CompletableFuture<Measured> result) {}

  /**
   * Round trips after the warm-up, when each was sent ({@link System#nanoTime}), and the decode
   * JVM's CPU time per round trip meanwhile.
   */
  private record Measured(double[] samplesUs, long[] sentAtNanos, double cpuUsPerRoundTrip) {}

  /** The decode side: one RemoteBlocks out, wait for its WriteDone, record, next. */
  private static final class Pinger {
    private final Start start;
    private final double[] samples;
    private final long[] sentAt;
    private final long warmupEndNanos;
    private int sent;
    private int warmedUpAt = -1;
    private long sentNanos;
    private long cpuAtWarmedUpNanos;

    private Pinger(Start start) {
      this.start = start;
      this.samples = new double[start.roundTrips()];
      this.sentAt = new long[start.roundTrips()];
      this.warmupEndNanos = System.nanoTime() + start.warmupNanos();
    }

    static Behavior<Object> create() {
      return Behaviors.receive(Object.class)
          .onMessage(Start.class, s -> {
            Pinger p = new Pinger(s);
            p.send();
            return p.running();
          })
          .build();
    }

    private Behavior<Object> running() {
      return Behaviors.receive(Object.class)
          .onMessage(PeerProtocol.WriteDone.class, this::onWriteDone)
          .build();
    }

    private static long processCpuNanos() {
      return ((com.sun.management.OperatingSystemMXBean)
              java.lang.management.ManagementFactory.getOperatingSystemMXBean())
          .getProcessCpuTime();
    }

    private void send() {
      int i = sent++;
      sentNanos = System.nanoTime();
      start.prefill().tell(new PeerProtocol.RemoteBlocks("tx-" + i, "req-" + i, start.blockIds(),
          "bench-decode", 0, 0));
    }

    private Behavior<Object> onWriteDone(PeerProtocol.WriteDone m) {
      long now = System.nanoTime();
      int i = sent - 1;
      if (!m.transferId().equals("tx-" + i)) {
        start.result().completeExceptionally(new IllegalStateException(
            "expected WriteDone for tx-" + i + ", got " + m.transferId()));
        return Behaviors.stopped();
      }
      if (warmedUpAt < 0 && i + 1 >= start.warmup() && now >= warmupEndNanos) {
        warmedUpAt = i + 1;
        cpuAtWarmedUpNanos = processCpuNanos();
      } else if (warmedUpAt >= 0) {
        samples[i - warmedUpAt] = (now - sentNanos) / 1e3;
        sentAt[i - warmedUpAt] = sentNanos;
      }
      if (warmedUpAt >= 0 && sent == warmedUpAt + start.roundTrips()) {
        double cpuUs = (processCpuNanos() - cpuAtWarmedUpNanos) / 1e3 / start.roundTrips();
        start.result().complete(new Measured(samples, sentAt, cpuUs));
        return Behaviors.stopped();
      }
      send();
      return Behaviors.same();
    }
  }
}
