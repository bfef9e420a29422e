package dev.kvferry.router;

import dev.kvferry.engine.EngineService;
import dev.kvferry.actors.CborSerializable;
import dev.kvferry.actors.LocalOnly;
import dev.kvferry.actors.connector.KvTransferParams;
import dev.kvferry.actors.connector.Role;
import dev.kvferry.actors.connector.TransferMode;
import dev.kvferry.actors.engine.EngineIdentity;
import dev.kvferry.engine.RequestSpec;
import dev.kvferry.engine.EngineService.Outcome;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.UUID;
import org.apache.pekko.actor.typed.ActorRef;
import org.apache.pekko.actor.typed.Behavior;
import org.apache.pekko.actor.typed.javadsl.AbstractBehavior;
import org.apache.pekko.actor.typed.javadsl.ActorContext;
import org.apache.pekko.actor.typed.javadsl.Behaviors;
import org.apache.pekko.actor.typed.javadsl.Receive;
import org.apache.pekko.actor.typed.receptionist.Receptionist;
import org.apache.pekko.actor.typed.receptionist.ServiceKey;
import org.jspecify.annotations.Nullable;

/**
 * Picks a (prefill, decode) pair for each request from live cluster membership: the engine of each
 * role with the fewest transfers in flight, ties broken round-robin. An engine that leaves the
 * listing drops out at once, and the requests in flight on it are answered as failed. Replaces the
 * seed's proxy and its 3-second pings.
 */
public final class RouterActor extends AbstractBehavior<RouterActor.Command> {

  public static final ServiceKey<Command> SERVICE_KEY =
      ServiceKey.create(Command.class, "kvferry-router");

  public sealed interface Command {}

  /**
   * Run one request through a P and a D; {@code replyTo} gets one {@link Routed} at the end.
   *
   * @param mode only engines of this transfer mode, or null for any (P and D always share one)
   */
  public record Route(RequestSpec spec, @Nullable TransferMode mode, ActorRef<Routed> replyTo)
      implements Command, CborSerializable {}

  /** How a routed request ended: D's outcome (or P's, when it never reached D). */
  public record Routed(
      String requestId,
      String prefillEngineId,
      String decodeEngineId,
      @Nullable TransferMode mode,
      Outcome.Status status,
      long bytes,
      long transferNanos,
      String detail)
      implements CborSerializable {}

  /** The engine ids the router would route to now, by role (for status and tests). */
  public record GetRoutable(ActorRef<Routable> replyTo) implements Command, CborSerializable {}

  public record Routable(List<String> prefill, List<String> decode) implements CborSerializable {}

  private record Listed(Receptionist.Listing listing) implements Command, LocalOnly {}

  private record EngineOutcome(Outcome outcome) implements Command, LocalOnly {}

  private record Candidate(EngineIdentity identity, ActorRef<EngineService.Command> ref) {}

  private static final class InFlight {
    final Route route;
    final Candidate prefill;
    final Candidate decode;
    final String transferId;
    @Nullable Outcome prefillOutcome;
    @Nullable Outcome decodeOutcome;

    InFlight(Route route, Candidate prefill, Candidate decode, String transferId) {
      this.route = route;
      this.prefill = prefill;
      this.decode = decode;
      this.transferId = transferId;
    }
  }

  private final Map<Role, List<Candidate>> engines = new HashMap<>();
  private final Map<String, Integer> load = new HashMap<>();
  private final Map<String, InFlight> inFlight = new HashMap<>();
  private final ActorRef<Outcome> outcomeAdapter;
  private long routed;

  public static Behavior<Command> create() {
    return Behaviors.setup(RouterActor::new);
  }

  private RouterActor(ActorContext<Command> ctx) {
    super(ctx);
    this.outcomeAdapter = ctx.messageAdapter(Outcome.class, EngineOutcome::new);
    ActorRef<Receptionist.Listing> listings =
        ctx.messageAdapter(Receptionist.Listing.class, Listed::new);
    for (Role role : Role.values()) {
      engines.put(role, List.of());
      ctx.getSystem()
          .receptionist()
          .tell(Receptionist.subscribe(EngineService.serviceKey(role), listings));
    }
    ctx.getSystem().receptionist().tell(Receptionist.register(SERVICE_KEY, ctx.getSelf()));
  }

  @Override
  public Receive<Command> createReceive() {
    return newReceiveBuilder()
        .onMessage(Route.class, this::onRoute)
        .onMessage(Listed.class, this::onListed)
        .onMessage(EngineOutcome.class, m -> onOutcome(m.outcome()))
        .onMessage(GetRoutable.class, m -> {
          m.replyTo().tell(new Routable(ids(Role.PREFILL), ids(Role.DECODE)));
          return this;
        })
        .build();
  }

  private Behavior<Command> onRoute(Route m) {
    Optional<Candidate> p = pick(Role.PREFILL, m.mode());
    Optional<Candidate> d = p.flatMap(prefill -> pick(Role.DECODE, prefill.identity().mode()));
    if (p.isEmpty() || d.isEmpty()) {
      m.replyTo().tell(new Routed(m.spec().requestId(), "", "", null, Outcome.Status.FAILED, 0, 0,
          "no " + (p.isEmpty() ? "prefill" : "decode") + " engine"
              + (m.mode() == null ? "" : " in " + m.mode().configName() + " mode")
              + " in the cluster"));
      return this;
    }
    String requestId = m.spec().requestId();
    if (inFlight.containsKey(requestId)) {
      m.replyTo().tell(new Routed(requestId, "", "", null, Outcome.Status.FAILED, 0, 0,
          "request id " + requestId + " is already in flight"));
      return this;
    }
    Candidate prefill = p.get();
    Candidate decode = d.get();
    // Unique across routers and restarts (a count alone starts again with each router): a P node
    // refuses a transfer id it has kept blocks under before, and a refused one on P is freed.
    String transferId = "tx" + (++routed) + "-" + requestId + "-" + UUID.randomUUID();
    InFlight f = new InFlight(m, prefill, decode, transferId);
    inFlight.put(requestId, f);
    load.merge(prefill.identity().engineId(), 1, Integer::sum);
    load.merge(decode.identity().engineId(), 1, Integer::sum);
    prefill.ref().tell(new EngineService.Submit(
        m.spec(),
        KvTransferParams.forPrefill(transferId, decode.identity().engineId(), decode.identity().dpRank()),
        outcomeAdapter));
    if (prefill.identity().mode() == TransferMode.WRITE) {
      // WRITE: D allocates now and tells P where to write while P computes.
      decode.ref().tell(new EngineService.Submit(
          m.spec(),
          KvTransferParams.forDecode(transferId, prefill.identity().engineId(),
              prefill.identity().dpRank()),
          outcomeAdapter));
    }
    return this;
  }

  private Optional<Candidate> pick(Role role, @Nullable TransferMode mode) {
    List<Candidate> list =
        listing(role).stream().filter(c -> mode == null || c.identity().mode() == mode).toList();
    if (list.isEmpty()) {
      return Optional.empty();
    }
    int min = list.stream().mapToInt(c -> load.getOrDefault(c.identity().engineId(), 0)).min().getAsInt();
    List<Candidate> least = new ArrayList<>();
    for (Candidate c : list) {
      if (load.getOrDefault(c.identity().engineId(), 0) == min) {
        least.add(c);
      }
    }
    return Optional.of(least.get((int) (routed % least.size())));
  }

  private Behavior<Command> onOutcome(Outcome o) {
    InFlight f = inFlight.get(o.requestId());
    if (f == null) {
      return this;
    }
    if (o.role() == Role.PREFILL) {
      f.prefillOutcome = o;
      boolean read = f.prefill.identity().mode() == TransferMode.READ;
      if (read && o.status() == Outcome.Status.DONE && o.paramsForPeer() != null) {
        f.decode.ref().tell(new EngineService.Submit(f.route.spec(), o.paramsForPeer(), outcomeAdapter));
      } else if (read) {
        // READ and P did not produce params (aborted): D is never involved.
        f.decodeOutcome = o;
      }
    } else {
      f.decodeOutcome = o;
    }
    if (f.prefillOutcome != null && f.decodeOutcome != null) {
      finish(f, f.prefillOutcome, f.decodeOutcome);
    }
    return this;
  }

  private void finish(InFlight f, Outcome p, Outcome d) {
    inFlight.remove(f.route.spec().requestId());
    load.merge(f.prefill.identity().engineId(), -1, Integer::sum);
    load.merge(f.decode.identity().engineId(), -1, Integer::sum);
    // Bytes at D that differ from P's are never hidden: a mismatch is reported as one whatever
    // else happened. Otherwise an abort on either side is what the request was.
    Outcome.Status status =
        d.status() == Outcome.Status.MISMATCH ? Outcome.Status.MISMATCH
            : p.status() == Outcome.Status.ABORTED || d.status() == Outcome.Status.ABORTED
                ? Outcome.Status.ABORTED
                : d.status();
    String detail = status == d.status() ? d.detail() : p.detail() + "; decode: " + d.detail();
    f.route.replyTo().tell(new Routed(
        f.route.spec().requestId(), f.prefill.identity().engineId(), f.decode.identity().engineId(),
        f.prefill.identity().mode(), status, d.bytes(), d.transferNanos(), detail));
  }

  private Behavior<Command> onListed(Listed m) {
    for (Role role : Role.values()) {
      ServiceKey<EngineService.Command> key = EngineService.serviceKey(role);
      if (!m.listing().isForKey(key)) {
        continue;
      }
      List<Candidate> list = new ArrayList<>();
      for (ActorRef<EngineService.Command> ref : m.listing().getServiceInstances(key)) {
        EngineIdentity.fromActorName(ref.path().name()).ifPresent(id -> list.add(new Candidate(id, ref)));
      }
      list.sort(Comparator.comparing(c -> c.identity().engineId()));
      engines.put(role, List.copyOf(list));
    }
    // Requests on an engine that left fail now, not after a timeout.
    for (InFlight f : new ArrayList<>(inFlight.values())) {
      String gone = null;
      if (!listed(Role.PREFILL, f.prefill)) {
        gone = f.prefill.identity().engineId();
      } else if (!listed(Role.DECODE, f.decode)) {
        gone = f.decode.identity().engineId();
      }
      if (gone != null) {
        Outcome failed = new Outcome(f.route.spec().requestId(), gone, Role.DECODE,
            Outcome.Status.FAILED, null, 0, 0, "engine " + gone + " left the cluster");
        if (f.prefillOutcome == null) {
          f.prefillOutcome = failed;
        }
        f.decodeOutcome = failed;
        finish(f, f.prefillOutcome, failed);
      }
    }
    return this;
  }

  private List<String> ids(Role role) {
    return listing(role).stream().map(c -> c.identity().engineId()).toList();
  }

  private boolean listed(Role role, Candidate c) {
    return listing(role).stream().anyMatch(e -> e.ref().equals(c.ref()));
  }

  private List<Candidate> listing(Role role) {
    return engines.getOrDefault(role, List.of());
  }
}
