"""The capacity model behind `nsctl plan` (docs/scaling.md): a fleet description and a measured costs file
(`python -m bench --only costs`) in, a plan out: Raft voters, worker processes per node, read replicas,
Raft groups (shards), memory and network per node, and which resource runs out first, every figure with the
arithmetic that made it so an operator can check it by hand.

Pure: no I/O, no clock; the same fleet and costs give the same plan. Its assumptions (docs/scaling.md,
"The model") in one place:
- every broker sends its heartbeat (an unchanged registration) to every node, as RocketMQ brokers register
  with every nameserver they are given. A node with no worker process: its core handles them (parsing the whole
  topic table), a follower's core forwards their liveness, which carries the broker's names and address only:
  the leader's cost per forwarded heartbeat has no per-topic part (the costs file's is noise; docs/scaling.md,
  "Validation against the simulator"). A node with worker processes: the workers alone hold its gRPC and
  remoting ports (nameserver/worker.py), decode and compare each heartbeat over their replica and answer it;
  the core hears a liveness note (NOTE_ALIVE: names, address, DataVersion; nameserver/remoting/corechannel.py),
  which a follower's core buffers and forwards to the leader every forward_interval_ms. So the heartbeat's
  receive cost (`heartbeat_worker_receive_cpu_us`, and its cost alone) is the workers', and a core pays
  `heartbeat_noted_core_cpu_us` per heartbeat (both optional in a costs file: without them the core's receive
  cost and the leader's cost of a forwarded liveness stand in, and the plan says so). Changed registrations go
  to the core as ever;
- a fleet's heartbeats and remoting reads arrive one at a time on connections of their own: each costs
  `remoting_heartbeat_alone_cpu_us` / `remoting_read_alone_cpu_us` (or one `remoting_request_alone_cpu_us`
  for both) beyond the per-operation costs, which come from pipelined loads, in the process that holds the
  connection (the core with no worker, else a worker); every
  node's core also spends its idle CPU (both optional in a costs file: a plan without them says so);
- a changed registration (a broker restart, a topic change) rewrites all of its broker's topics: a topic
  change is costed as a whole registration, which overstates it;
- route reads, watch events and linearizable reads are spread evenly over every read-serving process
  (the cores when there is no worker, else the worker processes: with workers the core serves no client
  read); a voter's heartbeats over its workers; each such process is one Python interpreter and uses at most
  one core;
- each watcher receives every changed record (the worst case: a watcher of everything);
- the bytes of a route grow with its brokers (the measured route had `route_brokers`); its CPU does not;
- every load grows linearly with the fleet, so "saturates at x N" is the fleet multiple at which a
  resource reaches its budget (`headroom` of the resource).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any

GIB = 1 << 30
US_PER_S = 1_000_000.0


class PlanError(ValueError):
    """A fleet or costs file the model cannot use; the message names the field."""


@dataclass(frozen=True)
class Fleet:
    """What the nameserver has to carry, and the machines it runs on."""

    brokers: int
    topics: int
    queues_per_topic: int = 8
    brokers_per_topic: int = 2          # broker names holding each topic: a route's brokers
    clients: int = 0
    topics_per_client: float = 1.0      # routes each client polls
    route_poll_s: float = 30.0          # RocketMQ clients' pollNameServerInterval
    heartbeat_s: float = 30.0           # RocketMQ brokers' registerBrokerTimeoutMills period
    remoting_share: float = 1.0         # of route reads over remoting (RocketMQ clients), the rest gRPC
    broker_restarts_per_hour: float = 0.0
    topic_changes_per_hour: float = 0.0
    watchers: int = 0
    linearizable_reads_per_s: float = 0.0
    kv_bytes: int = 0
    voters: int = 3                     # Raft members of a group
    cores_per_node: int = 8
    memory_per_node_bytes: int = 64 * GIB
    network_per_node_bytes_per_s: float = 1.25e9   # 10 Gbit/s
    headroom: float = 0.7               # the share of a core, of memory, of the network a plan may use

    @staticmethod
    def from_dict(raw: dict[str, Any]) -> Fleet:
        known = {f.name: f for f in fields(Fleet)}
        unknown = sorted(set(raw) - set(known))
        if unknown:
            raise PlanError(f"fleet: unknown field {unknown[0]!r} (known: {', '.join(known)})")
        for required in ("brokers", "topics"):
            if required not in raw:
                raise PlanError(f"fleet: {required} is required")
        values: dict[str, Any] = {}
        for name, value in raw.items():
            kind = int if known[name].type in ("int", int) else float
            if isinstance(value, bool) or not isinstance(value, int | float) or \
                    (kind is int and not float(value).is_integer()):
                raise PlanError(f"fleet: {name} must be {'an integer' if kind is int else 'a number'}, got {value!r}")
            values[name] = kind(value)
        fleet = Fleet(**values)
        fleet._check()
        return fleet

    def _check(self) -> None:
        for name in ("brokers", "topics", "queues_per_topic", "brokers_per_topic", "route_poll_s", "heartbeat_s",
                     "voters", "cores_per_node", "memory_per_node_bytes", "network_per_node_bytes_per_s", "headroom"):
            if getattr(self, name) <= 0:
                raise PlanError(f"fleet: {name} must be > 0, got {getattr(self, name)!r}")
        for name in ("clients", "topics_per_client", "broker_restarts_per_hour", "topic_changes_per_hour",
                     "watchers", "linearizable_reads_per_s", "kv_bytes"):
            if getattr(self, name) < 0:
                raise PlanError(f"fleet: {name} must be >= 0, got {getattr(self, name)!r}")
        if self.headroom > 1 or self.remoting_share < 0 or self.remoting_share > 1:
            raise PlanError("fleet: headroom and remoting_share must be within 0..1")
        if self.brokers_per_topic > self.brokers:
            raise PlanError(f"fleet: brokers_per_topic ({self.brokers_per_topic}) exceeds brokers ({self.brokers})")
        if self.cores_per_node < 2:
            raise PlanError("fleet: cores_per_node must be at least 2 (the core and one read-serving process)")


# The costs the model reads from the costs file's "costs" table (bench/costs.py writes them).
COST_KEYS = (
    "route_read_grpc_cpu_us", "route_read_remoting_cpu_us", "route_read_grpc_bytes_out",
    "route_read_remoting_bytes_out", "route_read_remoting_bytes_in", "route_brokers",
    "heartbeat_receive_cpu_us_base", "heartbeat_receive_cpu_us_per_topic",
    "heartbeat_forwarded_leader_cpu_us_base", "heartbeat_bytes_in_base", "heartbeat_bytes_in_per_topic",
    "changed_registration_leader_cpu_us_base", "changed_registration_leader_cpu_us_per_topic",
    "changed_registration_follower_cpu_us_base", "changed_registration_follower_cpu_us_per_topic",
    "changed_registration_follower_bytes_in_base", "changed_registration_follower_bytes_in_per_topic",
    "changed_registration_worker_replica_cpu_us_base", "changed_registration_worker_replica_cpu_us_per_topic",
    "changed_registration_follower_cpu_us_with_workers_base",
    "changed_registration_follower_cpu_us_with_workers_per_topic", "worker_replicas_measured",
    "linearizable_read_serving_cpu_us", "linearizable_read_leader_cpu_us",
    "watch_event_cpu_us", "watch_event_bytes_out", "expiry_leader_cpu_us",
    "memory_node_idle_rss_bytes", "memory_worker_idle_rss_bytes", "memory_per_broker_rss_bytes",
    "memory_per_queue_data_rss_bytes", "memory_per_queue_rss_bytes", "memory_per_kv_byte_rss",
)


ALONE_KEY = "remoting_request_alone_cpu_us"
# The same, derived for each kind of request on its own (a heartbeat carries its broker's whole topic table, a
# route read a topic name): each from a simulator run of that load alone. Each, where given, wins over ALONE_KEY.
HEARTBEAT_ALONE_KEY = "remoting_heartbeat_alone_cpu_us"
READ_ALONE_KEY = "remoting_read_alone_cpu_us"
IDLE_KEY = "node_idle_cpu_us"  # from the costs file's idle_cpu_cores_per_node (mean over its nodes)
# With worker processes (bench/costs.py, measure_noted_heartbeats): what a node's core pays per heartbeat a worker
# answered (the liveness note, and a follower's forwarding of it), and what the worker pays to receive it.
NOTED_KEY = "heartbeat_noted_core_cpu_us"
WORKER_RECEIVE_KEY = "heartbeat_worker_receive_cpu_us"  # _base and _per_topic, as heartbeat_receive_cpu_us


def read_costs(doc: dict[str, Any]) -> dict[str, float]:
    """The values the model needs from a costs file, or a PlanError naming the missing or bad one."""
    table = doc.get("costs") if isinstance(doc, dict) else None
    if not isinstance(table, dict):
        raise PlanError("costs file: no \"costs\" table (write one with python -m bench --only costs)")
    out: dict[str, float] = {}
    for key in COST_KEYS:
        entry = table.get(key)
        value = entry.get("value") if isinstance(entry, dict) else None
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise PlanError(f"costs file: costs.{key}.value missing or not a number")
        out[key] = float(value)
    # Optional (a costs file may predate them; the plan then says what it leaves out): the CPU a remoting request
    # costs when it arrives alone on its connection, as a fleet's do, beyond the pipelined loads' per-operation
    # costs above; and each node's idle CPU (Raft heartbeats, timers).
    for key in (ALONE_KEY, HEARTBEAT_ALONE_KEY, READ_ALONE_KEY, NOTED_KEY, f"{WORKER_RECEIVE_KEY}_base",
                f"{WORKER_RECEIVE_KEY}_per_topic"):
        alone = table.get(key)
        alone_value = alone.get("value") if isinstance(alone, dict) else None
        if isinstance(alone_value, int | float) and not isinstance(alone_value, bool) and math.isfinite(alone_value):
            out[key] = float(alone_value)
    idle = doc.get("idle_cpu_cores_per_node")
    if isinstance(idle, dict) and idle and all(isinstance(v, int | float) and not isinstance(v, bool)
                                               for v in idle.values()):
        out[IDLE_KEY] = sum(idle.values()) / len(idle) * US_PER_S
    return out


@dataclass
class Step:
    """One figure of the plan: what it is, its formula with the numbers put in, and its value."""

    name: str
    formula: str
    value: float
    unit: str


@dataclass
class Plan:
    steps: list[Step] = field(default_factory=list)
    voters: int = 0
    workers_per_node: int = 0
    read_replicas: int = 0
    groups: int = 1
    memory_per_node_bytes: float = 0.0
    network_per_node_bytes_per_s: float = 0.0
    saturates_first: str = ""
    saturation: dict[str, float] = field(default_factory=dict)  # resource -> fleet multiple at its budget
    notes: list[str] = field(default_factory=list)

    def add(self, name: str, formula: str, value: float, unit: str = "") -> float:
        self.steps.append(Step(name, formula, value, unit))
        return value

    def to_dict(self) -> dict[str, Any]:
        return {"voters": self.voters, "workers_per_node": self.workers_per_node, "read_replicas": self.read_replicas,
                "groups": self.groups, "memory_per_node_bytes": round(self.memory_per_node_bytes),
                "network_per_node_bytes_per_s": round(self.network_per_node_bytes_per_s),
                "saturates_first": self.saturates_first,
                "saturation_fleet_multiple": {k: round(v, 3) if math.isfinite(v) else None  # None: never
                                              for k, v in self.saturation.items()},
                "steps": [{"name": s.name, "formula": s.formula, "value": _round(s.value), "unit": s.unit}
                          for s in self.steps],
                "notes": self.notes}


def _round(x: float) -> float:
    return round(x, 3) if abs(x) < 1000 else round(x)


def _n(x: float) -> str:
    """A number as the arithmetic shows it."""
    if x == int(x) and abs(x) < 1e15:
        return f"{int(x):,}"
    return f"{x:,.3g}" if abs(x) < 1 else f"{x:,.1f}"


def plan(fleet: Fleet, c: dict[str, float], workers: int | None = None) -> Plan:
    """The plan for `fleet` from the costs `c` (read_costs). Every figure is one Step of the arithmetic.
    `workers`: the worker processes per node to cost (a cluster as run: bench/fleet/validate.py) instead of
    the number the plan would choose; no read replica then."""
    p = Plan(voters=fleet.voters)
    f = fleet
    budget = f.headroom * US_PER_S
    p.add("core budget", f"headroom {_n(f.headroom)} x 1,000,000 us/s (one Python process uses one core)",
          budget, "us CPU/s")

    # ---- the load --------------------------------------------------------------------------------------
    tpb = p.add("topics per broker", f"topics {_n(f.topics)} x brokers_per_topic {_n(f.brokers_per_topic)} / "
                f"brokers {_n(f.brokers)}", f.topics * f.brokers_per_topic / f.brokers)
    reads = p.add("route reads", f"clients {_n(f.clients)} x topics_per_client {_n(f.topics_per_client)} / "
                  f"route_poll_s {_n(f.route_poll_s)}", f.clients * f.topics_per_client / f.route_poll_s, "/s")
    hbs = p.add("heartbeats per node", f"brokers {_n(f.brokers)} / heartbeat_s {_n(f.heartbeat_s)} (each broker "
                "to every node)", f.brokers / f.heartbeat_s, "/s")
    regs = p.add("changed registrations", f"(broker_restarts_per_hour {_n(f.broker_restarts_per_hour)} + "
                 f"topic_changes_per_hour {_n(f.topic_changes_per_hour)}) / 3600",
                 (f.broker_restarts_per_hour + f.topic_changes_per_hour) / 3600, "/s")
    expiries = p.add("expiries", f"broker_restarts_per_hour {_n(f.broker_restarts_per_hour)} / 3600",
                     f.broker_restarts_per_hour / 3600, "/s")
    events = p.add("watch events delivered", f"watchers {_n(f.watchers)} x changed registrations {_n(regs)}/s x "
                   f"(topics per broker {_n(tpb)} + 1) records", f.watchers * regs * (tpb + 1), "/s")

    def line(key: str) -> tuple[float, str]:
        base, per = c[f"{key}_base"], c[f"{key}_per_topic"]
        return base + per * tpb, f"({_n(base)} + {_n(per)} x {_n(tpb)} topics)"

    # ---- the leader's core: every write of the group ---------------------------------------------------
    reg_l, reg_l_f = line("changed_registration_leader_cpu_us")
    alone, idle = c.get(ALONE_KEY, 0.0), c.get(IDLE_KEY, 0.0)
    alone_hb, alone_read = c.get(HEARTBEAT_ALONE_KEY, alone), c.get(READ_ALONE_KEY, alone)
    if not {ALONE_KEY, HEARTBEAT_ALONE_KEY, READ_ALONE_KEY} & set(c):
        p.notes.append(f"The costs file has no {ALONE_KEY}: each heartbeat and remoting read is costed as in a "
                       "pipelined load, which understates a fleet's (docs/scaling.md, \"Validation against the "
                       "simulator\").")
    if IDLE_KEY not in c:
        p.notes.append("The costs file has no idle_cpu_cores_per_node: a node's idle CPU is left out.")
    hb_r, hb_r_f = line("heartbeat_receive_cpu_us")
    hb_r, hb_r_f = hb_r + alone_hb, f"{hb_r_f[:-1]} + {_n(alone_hb)} alone)"
    remoting_read = c["route_read_remoting_cpu_us"] + alone_read
    hb_f = c["heartbeat_forwarded_leader_cpu_us_base"]  # liveness only: no topic table reaches the leader
    hb_f_f = _n(hb_f)
    # with workers: what the core pays per heartbeat (the note), what a worker pays (its receive and alone)
    hb_core = c.get(NOTED_KEY, hb_f)
    if f"{WORKER_RECEIVE_KEY}_base" in c and f"{WORKER_RECEIVE_KEY}_per_topic" in c:
        hb_w, hb_w_f = line(WORKER_RECEIVE_KEY)
    else:
        hb_w, hb_w_f = line("heartbeat_receive_cpu_us")
    hb_w, hb_w_f = hb_w + alone_hb, f"{hb_w_f[:-1]} + {_n(alone_hb)} alone)"
    followers = f.voters - 1

    def leader_core_writes(name: str, heartbeat: float, heartbeat_f: str) -> float:
        """The leader's core for its group's writes, each heartbeat it hears costing `heartbeat`."""
        return p.add(
            name, f"changed registrations {_n(regs)}/s x {reg_l_f} us + {heartbeat_f} + "
            f"forwarded heartbeats {_n(hbs)}/s x {followers} followers x {hb_f_f} us + expiries {_n(expiries)}/s x "
            f"{_n(c['expiry_leader_cpu_us'])} us + linearizable reads {_n(f.linearizable_reads_per_s)}/s x "
            f"{_n(c['linearizable_read_leader_cpu_us'])} us + idle {_n(idle)}",
            regs * reg_l + hbs * heartbeat + hbs * followers * hb_f + expiries * c["expiry_leader_cpu_us"]
            + f.linearizable_reads_per_s * c["linearizable_read_leader_cpu_us"] + idle, "us CPU/s")

    leader_writes = leader_core_writes("leader core CPU for writes", hb_r, f"heartbeats {_n(hbs)}/s x {hb_r_f} us")
    p.add("one group's changed registrations at budget (no heartbeat load)", f"budget {_n(budget)} / {reg_l_f} us",
          budget / reg_l, "/s")

    # ---- read-serving processes ------------------------------------------------------------------------
    read_cost = p.add("CPU per route read", f"remoting_share {_n(f.remoting_share)} x "
                      f"({_n(c['route_read_remoting_cpu_us'])} + {_n(alone_read)} alone) us + "
                      f"{_n(1 - f.remoting_share)} x "
                      f"{_n(c['route_read_grpc_cpu_us'])} us (gRPC)",
                      f.remoting_share * remoting_read
                      + (1 - f.remoting_share) * c["route_read_grpc_cpu_us"], "us")
    serve = p.add("read-serving CPU, whole fleet",
                  f"route reads {_n(reads)}/s x {_n(read_cost)} us + watch events {_n(events)}/s x "
                  f"{_n(c['watch_event_cpu_us'])} us + linearizable reads {_n(f.linearizable_reads_per_s)}/s x "
                  f"{_n(c['linearizable_read_serving_cpu_us'])} us",
                  reads * read_cost + events * c["watch_event_cpu_us"]
                  + f.linearizable_reads_per_s * c["linearizable_read_serving_cpu_us"], "us CPU/s")
    reg_f, reg_f_f = line("changed_registration_follower_cpu_us")
    rep_own, rep_own_f = line("changed_registration_worker_replica_cpu_us")
    fed, _ = line("changed_registration_follower_cpu_us_with_workers")
    feed = max(0.0, (fed - reg_f) / c["worker_replicas_measured"])
    replica_apply = p.add("a worker replica's CPU to follow the writes",
                          f"changed registrations {_n(regs)}/s x {rep_own_f} us", regs * rep_own, "us CPU/s")
    per_worker = p.add("a worker's CPU left for reads", f"budget {_n(budget)} - {_n(replica_apply)}",
                       budget - replica_apply, "us CPU/s")
    follower_core = p.add("a follower core's CPU (no worker)",
                          f"changed registrations {_n(regs)}/s x {reg_f_f} us + heartbeats {_n(hbs)}/s x {hb_r_f} us "
                          f"+ idle {_n(idle)}", regs * reg_f + hbs * hb_r + idle, "us CPU/s")
    busiest_core = max(leader_writes, follower_core)
    hb_workers = 0.0
    if workers is None and busiest_core + serve / f.voters <= budget or workers == 0:
        workers = 0
        p.add("worker processes per node", f"0: the busiest core {_n(busiest_core)} + its share of reads "
              f"{_n(serve)} / {f.voters} fits the budget {_n(budget)}", 0)
        replicas = 0
        core_reads = serve / f.voters
    else:
        if per_worker <= 0:
            raise PlanError("a worker replica cannot even follow the writes within its budget: shard first")
        if f"{WORKER_RECEIVE_KEY}_base" not in c or f"{WORKER_RECEIVE_KEY}_per_topic" not in c:
            p.notes.append(f"The costs file has no {WORKER_RECEIVE_KEY}_base/_per_topic: a worker's CPU per "
                           "heartbeat is costed as the core's (heartbeat_receive_cpu_us: the same code).")
        if NOTED_KEY not in c:
            p.notes.append(f"The costs file has no {NOTED_KEY}: a core's CPU per heartbeat its workers answered "
                           "(the liveness note) is costed as the leader's per forwarded heartbeat "
                           "(heartbeat_forwarded_leader_cpu_us_base).")
        # The workers alone hold the node's ports (nameserver/worker.py): they receive its heartbeats.
        hb_workers = p.add("heartbeats a node's workers receive (CPU)", f"heartbeats {_n(hbs)}/s x {hb_w_f} us",
                           hbs * hb_w, "us CPU/s")
        total = math.ceil((serve + f.voters * hb_workers) / per_worker)
        p.add("read-serving processes needed", f"ceil(({_n(serve)} + voters {f.voters} x {_n(hb_workers)}) / "
              f"{_n(per_worker)})", total)
        max_per_node = min(f.cores_per_node - 1, 64)
        if workers is None:
            workers = min(max_per_node, max(1, math.ceil(total / f.voters)))
            p.add("worker processes per node", f"min(cores_per_node {f.cores_per_node} - 1, ceil({total} / voters "
                  f"{f.voters}))", workers)
            replicas = max(0, total - workers * f.voters)
            p.add("read replicas beyond the voters' workers", f"max(0, {total} - {workers} x {f.voters})", replicas)
        else:
            p.add("worker processes per node", f"{workers}: as given", workers)
            replicas = 0
        if hb_workers > workers * per_worker:
            p.notes.append(f"A node's heartbeats alone ({_n(round(hb_workers))} us CPU/s) exceed what its {workers} "
                           "workers can receive: read replicas do not take them (brokers register with the voters). "
                           "Brokers must spread their heartbeats or send them less often.")
        core_reads = p.add("the core's share of client reads", "0: with workers the core holds neither the gRPC "
                           "nor the remoting port (nameserver/worker.py)", 0.0, "us CPU/s")
        core_reads += p.add("core CPU to feed its workers",
                            f"changed registrations {_n(regs)}/s x {_n(feed)} us x {workers}",
                            regs * feed * workers, "us CPU/s")
        # What reaches the core of a heartbeat now: the worker's liveness note (a follower's core buffers and
        # forwards it); the receive cost above is the workers'.
        leader_writes = leader_core_writes("leader core CPU for writes, with workers", hb_core,
                                           f"heartbeats noted {_n(hbs)}/s x {_n(hb_core)} us")
        p.add("a follower core's CPU (with workers)",
              f"changed registrations {_n(regs)}/s x {reg_f_f} us + heartbeats noted {_n(hbs)}/s x {_n(hb_core)} us "
              f"+ idle {_n(idle)} + feeding {_n(core_reads)}", regs * reg_f + hbs * hb_core + idle + core_reads,
              "us CPU/s")
        p.add("a voter's worker's CPU", f"read-serving CPU {_n(serve)} / ({f.voters} voters x {workers} workers + "
              f"{replicas} replicas) + heartbeats {_n(hb_workers)} / {workers} workers + following the writes "
              f"{_n(replica_apply)}", serve / (f.voters * workers + replicas) + hb_workers / workers + replica_apply,
              "us CPU/s")
    p.workers_per_node, p.read_replicas = workers, replicas
    leader_core = p.add("the leader's core in one group, all it does", f"writes {_n(leader_writes)} + reads and "
                        f"feeding {_n(core_reads)}", leader_writes + core_reads, "us CPU/s")

    # ---- groups: what sharding would move ------------------------------------------------------------
    hb_fixed, hb_fixed_f = (hb_core, f"heartbeats noted {_n(hbs)}/s x {_n(hb_core)} us") if workers else \
        (hb_r, f"heartbeats it receives {_n(hbs)}/s x {hb_r_f} us")
    fixed = p.add("of the leader's core, what every node's core pays whatever the groups",
                  f"{hb_fixed_f} + idle {_n(idle)} + reads and feeding {_n(core_reads)}",
                  hbs * hb_fixed + idle + core_reads, "us CPU/s")
    movable = p.add("of the leader's core, what a group's leader alone pays (sharding splits it)",
                    f"{_n(leader_core)} - {_n(fixed)}", leader_core - fixed, "us CPU/s")
    if leader_core <= budget:
        groups = 1
        p.add("Raft groups needed", f"1: the leader's core {_n(leader_core)} fits the budget {_n(budget)}", 1)
    elif fixed >= budget:
        groups = 0
        p.add("Raft groups needed", f"none suffices: what every core pays {_n(fixed)} alone exceeds the budget "
              f"{_n(budget)}", 0)
        p.notes.append(("Every node's core hears of every broker's heartbeat (the liveness note its workers send "
                        "it) and feeds its workers: " if workers else
                        "Every node's core receives every broker's heartbeat and its share of the reads: ")
                       + "that alone exceeds one core's budget, and no number of groups moves it. Brokers must spread "
                       "their heartbeats (each given some nodes' addresses, not all) or send them less often.")
    else:
        groups = math.ceil(movable / (budget - fixed))
        p.add("Raft groups needed", f"ceil({_n(movable)} / (budget {_n(budget)} - {_n(fixed)}))", groups)
    p.groups = groups
    if groups > 1:
        p.notes.append("One group's leader core would need x"
                       f"{_n(round(leader_core / budget, 2))} of its budget. Sharding (brokers split between Raft "
                       "groups, each group's leader taking its share) is what would carry it: the product does "
                       "not shard yet (RIP-18 sharding, issue 29 item 4)."
                       + (f" {groups} groups over {f.voters} voters put more than one leader on a node's core: "
                          "more nodes are needed." if groups > f.voters else ""))

    # ---- memory per node --------------------------------------------------------------------------------
    queue_datas = f.topics * f.brokers_per_topic
    state = p.add("state per process",
                  f"brokers {_n(f.brokers)} x {_n(c['memory_per_broker_rss_bytes'])} B + queue datas "
                  f"{_n(queue_datas)} x {_n(c['memory_per_queue_data_rss_bytes'])} B + queues "
                  f"{_n(queue_datas * f.queues_per_topic)} x {_n(c['memory_per_queue_rss_bytes'])} B + KV bytes "
                  f"{_n(f.kv_bytes)} x {_n(c['memory_per_kv_byte_rss'])}",
                  f.brokers * c["memory_per_broker_rss_bytes"] + queue_datas * c["memory_per_queue_data_rss_bytes"]
                  + queue_datas * f.queues_per_topic * c["memory_per_queue_rss_bytes"]
                  + f.kv_bytes * c["memory_per_kv_byte_rss"], "bytes")
    memory = p.add("memory per node", f"core ({_n(c['memory_node_idle_rss_bytes'])} + {_n(state)}) + workers "
                   f"{workers} x ({_n(c['memory_worker_idle_rss_bytes'])} + {_n(state)})",
                   c["memory_node_idle_rss_bytes"] + state + workers * (c["memory_worker_idle_rss_bytes"] + state),
                   "bytes")
    p.memory_per_node_bytes = memory

    # ---- network per node -------------------------------------------------------------------------------
    scale = f.brokers_per_topic / c["route_brokers"]
    read_out = p.add("bytes per route read", f"{_n(c['route_read_remoting_bytes_out'])} B x brokers_per_topic "
                     f"{f.brokers_per_topic} / measured route's {_n(c['route_brokers'])} brokers "
                     f"+ request {_n(c['route_read_remoting_bytes_in'])} B",
                     c["route_read_remoting_bytes_out"] * scale + c["route_read_remoting_bytes_in"], "bytes")
    hb_in, hb_in_f = line("heartbeat_bytes_in")
    rep_in, rep_in_f = line("changed_registration_follower_bytes_in")
    serving_nodes = f.voters + replicas / max(1, workers or 1)
    network = p.add("network per node (the leader's, the busiest)",
                    f"route reads {_n(reads)}/s / {_n(serving_nodes)} serving nodes x {_n(read_out)} B + heartbeats "
                    f"{_n(hbs)}/s x {hb_in_f} B + watch events {_n(events)}/s / {f.voters} x "
                    f"{_n(c['watch_event_bytes_out'])} B + changed registrations {_n(regs)}/s x {followers} "
                    f"followers x {rep_in_f} B",
                    reads / serving_nodes * read_out + hbs * hb_in + events / f.voters * c["watch_event_bytes_out"]
                    + regs * followers * rep_in, "bytes/s")
    p.network_per_node_bytes_per_s = network

    # ---- what runs out first -----------------------------------------------------------------------------
    read_capacity = f.voters * min(f.cores_per_node - 1, 64) * per_worker
    read_load = serve + f.voters * hb_workers  # with workers, theirs: the heartbeats too
    sat = {
        "leader core CPU (writes)": budget / leader_core if leader_core else math.inf,
        "read-serving CPU (voters' cores)": read_capacity / read_load if read_load else math.inf,
        "memory per node": f.headroom * f.memory_per_node_bytes / memory,
        "network per node": f.headroom * f.network_per_node_bytes_per_s / network if network else math.inf,
    }
    for name, multiple in sat.items():
        p.add(f"saturates at (fleet multiple): {name}", _saturation_formula(name, f, budget, leader_core,
                                                                             read_capacity, serve, hb_workers, memory,
                                                                             network),
              multiple, "x")
    p.saturation = sat
    p.saturates_first = min(sat, key=lambda k: sat[k])
    return p


def _saturation_formula(name: str, f: Fleet, budget: float, leader: float, capacity: float, serve: float,
                        hb_workers: float, memory: float, network: float) -> str:
    if name.startswith("leader"):
        return f"budget {_n(budget)} / the leader's core in one group {_n(leader)}"
    if name.startswith("read"):
        return (f"voters {f.voters} x min(cores_per_node - 1, 64) x a worker's CPU for reads = {_n(capacity)} / "
                f"(read-serving CPU {_n(serve)}"
                + (f" + voters {f.voters} x heartbeats their workers receive {_n(hb_workers)})" if hb_workers else ")"))
    if name.startswith("memory"):
        return f"headroom {_n(f.headroom)} x {_n(f.memory_per_node_bytes)} B / {_n(memory)} B"
    return f"headroom {_n(f.headroom)} x {_n(f.network_per_node_bytes_per_s)} B/s / {_n(network)} B/s"


def render(p: Plan, fleet: Fleet, costs_source: str) -> str:
    """The plan as text: the answer first, then every step of the arithmetic."""
    out = [f"Plan (the model's projection from {costs_source}; docs/scaling.md)", "",
           f"  Raft voters (nodes)          {p.voters}",
           f"  worker processes per node    {p.workers_per_node}",
           f"  read replicas                {p.read_replicas}",
           "  Raft groups (shards) needed  " + ({0: "none suffices (see the notes)", 1: "1"}.get(
               p.groups, f"{p.groups}   <- the product does not shard yet")),
           f"  memory per node              {p.memory_per_node_bytes / GIB:,.2f} GiB",
           f"  network per node             {p.network_per_node_bytes_per_s / 1e6:,.2f} MB/s",
           f"  saturates first              {p.saturates_first} (at x{p.saturation[p.saturates_first]:,.2f} of "
           "this fleet)", ""]
    out += [f"  note: {n}" for n in p.notes]
    out += ["", "Arithmetic (us: microseconds of CPU; budget: headroom of one core):"]
    for s in p.steps:
        out.append(f"  {s.name} = {s.formula} = {_n(_round(s.value))}{(' ' + s.unit) if s.unit else ''}")
    return "\n".join(out) + "\n"


__all__ = ["ALONE_KEY", "COST_KEYS", "Fleet", "HEARTBEAT_ALONE_KEY", "IDLE_KEY", "NOTED_KEY", "READ_ALONE_KEY",
           "WORKER_RECEIVE_KEY", "Plan", "PlanError", "Step", "plan", "read_costs", "render"]
