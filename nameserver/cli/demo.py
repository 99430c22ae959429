"""`make demo`: how fast a producer stops choosing a dead broker, with watch versus a 30 s pull.

Starts a throwaway 3-node cluster (temporary directory, free ports), a fleet of simulated brokers that
heartbeat, and three producers sending (simulated sends) to one topic:

  watch      routes from a RouteCache fed by Watch, fault tolerance off (the route alone decides)
  pull       routes pulled every --pull-interval seconds (RocketMQ's behaviour), fault tolerance off
  pull+ft    the same pull, with latency fault tolerance (a failed send isolates the broker)

Then it kills one broker (its heartbeats stop, as in a crash) and prints when each producer last
chose it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field

from nameserver.cli.simulate import make_agents
from nameserver.client import (
    BrokerFleet,
    Client,
    MessageQueue,
    NameServerError,
    QueueSelector,
    RetryPolicy,
    RouteCache,
    SendFailed,
)
from nameserver.localports import free_ports
from nameserver.logformat import records
from nameserver.pb import api_pb2

TOPIC = "SimTopic0"


def start_cluster(root: str, size: int = 3, scan_interval_ms: int = 500) -> tuple[list[subprocess.Popen], list[str]]:
    ports = free_ports(2 * size)
    raft = [f"127.0.0.1:{ports[2 * i]}" for i in range(size)]
    grpc_addrs = [f"127.0.0.1:{ports[2 * i + 1]}" for i in range(size)]
    members = "".join(f'[[cluster.members]]\nraft_addr = "{r}"\ngrpc_addr = "{g}"\n\n'
                      for r, g in zip(raft, grpc_addrs, strict=True))
    procs = []
    for i in range(size):
        path = os.path.join(root, f"n{i + 1}.toml")
        with open(path, "w") as f:
            f.write(f'[node]\nraft_addr = "{raft[i]}"\ngrpc_addr = "{grpc_addrs[i]}"\ndata_dir = "n{i + 1}"\n'
                    "worker_processes = 0\n\n"
                    f"{members}[liveness]\nscan_interval_ms = {scan_interval_ms}\n")
        log = open(os.path.join(root, f"n{i + 1}.log"), "wb")  # noqa: SIM115 (closed with the process)
        procs.append(subprocess.Popen([sys.executable, "-m", "nameserver.cli.serve", "serve", "--config", path],
                                      stdout=log, stderr=subprocess.STDOUT, cwd=root))
    return procs, grpc_addrs


def wait_ready(client: Client, addrs: list[str], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            sts = [client.status(a, timeout=1.0) for a in addrs]
            if all(s.ready for s in sts) and any(s.role == api_pb2.ROLE_LEADER for s in sts):
                return
        except NameServerError:
            pass
        time.sleep(0.3)
    raise RuntimeError("the cluster did not become ready")


@dataclass
class ProducerRun:
    """A producer thread sending to TOPIC through a selector; remembers when it chose the dead broker."""

    name: str
    selector: QueueSelector
    dead: set[str]
    sends: int = 0
    failed_sends: int = 0
    picks_of_dead: list[float] = field(default_factory=list)
    killed_at: float = 0.0
    stop: threading.Event = field(default_factory=threading.Event)

    def send(self, mq: MessageQueue) -> None:
        now = time.monotonic()
        if mq.broker_name in self.dead:
            if self.killed_at:
                self.picks_of_dead.append(now - self.killed_at)
            raise ConnectionError(f"{mq.broker_name} is down")

    def run(self, rate: float) -> None:
        while not self.stop.wait(1.0 / rate):
            self.sends += 1
            try:
                self.selector.send(TOPIC, self.send)
            except SendFailed:
                self.failed_sends += 1
            except Exception:  # e.g. no route yet
                self.failed_sends += 1

    def last_pick(self) -> float | None:
        return self.picks_of_dead[-1] if self.picks_of_dead else None


def _fmt(t: float | None) -> str:
    return "never" if t is None else f"{t:6.2f} s"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--brokers", type=int, default=5)
    p.add_argument("--topics", type=int, default=20)
    p.add_argument("--timeout-ms", type=int, default=3000, help="the brokers' heartbeat timeout")
    p.add_argument("--pull-interval", type=float, default=30.0, help="the pulling producers' period")
    p.add_argument("--rate", type=float, default=50.0, help="sends per second per producer")
    args = p.parse_args(argv)
    root = tempfile.mkdtemp(prefix="rip18-demo-")
    procs: list[subprocess.Popen] = []
    try:
        procs, addrs = start_cluster(root)
        return _demo(args, addrs)
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
        shutil.rmtree(root, ignore_errors=True)


def _demo(args: argparse.Namespace, addrs: list[str]) -> int:
    client = Client(addrs, retry=RetryPolicy(deadline_s=30))
    print(f"starting a 3-node cluster on {', '.join(addrs)} ...", flush=True)
    wait_ready(client, addrs)
    agents = make_agents(args.brokers, args.topics, timeout_ms=args.timeout_ms, prefix="demo-broker")
    fleet = BrokerFleet(client, agents, heartbeat_interval_s=0.5).start()
    watch_cache = RouteCache(client, topics=[TOPIC]).start()
    pull_cache = RouteCache(Client(addrs), topics=[TOPIC], watch=False, pull_interval_s=args.pull_interval)
    dead: set[str] = set()
    producers = [ProducerRun("watch", QueueSelector(watch_cache, enabled=False), dead),
                 ProducerRun("pull", QueueSelector(pull_cache, enabled=False), dead),
                 ProducerRun("pull+ft", QueueSelector(pull_cache, enabled=True), dead)]
    removed_at: list[float] = []
    try:
        want = args.brokers * 4
        ok = watch_cache.wait_for(lambda: len(watch_cache.publish_queues(TOPIC)) == want, 60)
        pull_cache.start()  # its first pull (at once) sees every broker
        if not (ok and pull_cache.wait_for(lambda: len(pull_cache.publish_queues(TOPIC)) == want, 60)):
            print("the brokers did not register in time", file=sys.stderr)
            return 1
        print(f"{args.brokers} simulated brokers x {args.topics} topics registered and heartbeating; "
              f"{len(producers)} producers sending to {TOPIC} at {args.rate:g}/s each", flush=True)
        threads = [threading.Thread(target=pr.run, args=(args.rate,), daemon=True) for pr in producers]
        for t in threads:
            t.start()
        time.sleep(2.0)
        victim = agents[len(agents) // 2]
        name = victim.identity.broker_name
        killed_at = time.monotonic()
        watch_cache.add_listener(lambda offset, keys: removed_at.append(time.monotonic() - killed_at)
                                 if f"{records.TOPIC.prefix}{TOPIC}/{name}" in keys and not removed_at else None)
        for pr in producers:
            pr.killed_at = killed_at
        dead.add(name)
        fleet.kill(victim)
        print(f"killed {name} (heartbeats stopped, timeout {args.timeout_ms} ms); waiting for every producer "
              f"to drop it (up to ~{args.timeout_ms / 1000 + args.pull_interval:.0f} s) ...", flush=True)
        gone = lambda c: name not in {q.broker_name for q in c.publish_queues(TOPIC)}  # noqa: E731
        watch_cache.wait_for(lambda: gone(watch_cache), 60 + args.timeout_ms / 1000)
        pull_cache.wait_for(lambda: gone(pull_cache), 60 + args.timeout_ms / 1000 + args.pull_interval)
        time.sleep(1.0)
        for pr in producers:
            pr.stop.set()
        for t in threads:
            t.join(timeout=5)
        _report(args, name, removed_at[0] if removed_at else None, producers)
        return 0
    finally:
        fleet.stop(unregister=True)
        watch_cache.stop()
        pull_cache.stop()
        pull_cache.client.close()
        client.close()


def _report(args: argparse.Namespace, name: str, removed: float | None, producers: list[ProducerRun]) -> None:
    print()
    print(f"broker {name} killed at t = 0")
    print(f"removal applied (seen through watch)            at t = {_fmt(removed)}"
          f"   (heartbeat timeout {args.timeout_ms / 1000:g} s + expiry scan)")
    labels = {"watch": "producer, watch route cache", "pull": f"producer, {args.pull_interval:g} s pull",
              "pull+ft": f"producer, {args.pull_interval:g} s pull + fault tolerance"}
    for pr in producers:
        last = pr.last_pick()
        after = ""
        if last is not None and removed is not None:
            after = f"  ({last - removed:.2f} s after the removal)" if last > removed else "  (never after the removal)"
        print(f"{labels[pr.name]:<45} last chose it at t = {_fmt(last)}{after}; "
              f"{len(pr.picks_of_dead)} send(s) to it failed")
    watch_last, pull_last = producers[0].last_pick(), producers[1].last_pick()
    if watch_last is not None and pull_last is not None:
        print(f"\nwatch stopped the producer choosing the dead broker {pull_last - watch_last:.2f} s sooner "
              f"than a {args.pull_interval:g} s pull (which waits {args.pull_interval / 2:g} s on average after "
              f"the removal, up to {args.pull_interval:g} s).")


if __name__ == "__main__":
    sys.exit(main())
