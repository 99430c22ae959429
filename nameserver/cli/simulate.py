"""`nsctl broker simulate`: N simulated brokers with M topics each, registering and heartbeating.

Every broker registers (with its own DataVersion), heartbeats every --interval seconds through one
batched call, registers again when the cluster forgets it, and unregisters on Ctrl-C or at the end
of --duration. For demos and benchmarks; the brokers exist only as nameserver records.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from nameserver.client import BrokerAgent, BrokerFleet, BrokerIdentity, Client, RetryPolicy, topic_config


def make_agents(brokers: int, topics: int, *, cluster: str = "SimCluster", prefix: str = "sim-broker",
                topic_prefix: str = "SimTopic", queues: int = 4, timeout_ms: int = 0, shared: bool = True
                ) -> list[BrokerAgent]:
    """Brokers prefix-0..N-1 at 10.x.y.z:10911; each serves topic_prefix0..M-1 (shared) or its own."""
    agents = []
    for i in range(brokers):
        name = f"{prefix}-{i}"
        addr = f"10.{100 + i // 62500}.{i // 250 % 250}.{i % 250 + 1}:10911"
        names = [f"{topic_prefix}{t}" for t in range(topics)] if shared else \
            [f"{topic_prefix}-{i}-{t}" for t in range(topics)]
        identity = BrokerIdentity(cluster, name, addr, ha_server_addr=addr.rsplit(":", 1)[0] + ":10912",
                                  heartbeat_timeout_ms=timeout_ms)
        agents.append(BrokerAgent(identity, [topic_config(t, queues) for t in names]))
    return agents


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--brokers", type=int, default=10, help="simulated brokers (N)")
    parser.add_argument("--topics", type=int, default=100, help="topics per broker (M)")
    parser.add_argument("--cluster", default="SimCluster", help="cluster name")
    parser.add_argument("--prefix", default="sim-broker", help="broker names PREFIX-0..N-1")
    parser.add_argument("--topic-prefix", default="SimTopic", help="topic names PREFIX0..M-1")
    parser.add_argument("--own-topics", action="store_true", help="each broker its own topics (default: shared)")
    parser.add_argument("--queues", type=int, default=4, help="read and write queues per topic")
    parser.add_argument("--interval", type=float, default=1.0, help="heartbeat interval in seconds")
    parser.add_argument("--timeout-ms", type=int, default=10000, help="brokers' heartbeat timeout (0: server's)")
    parser.add_argument("--duration", type=float, default=0.0, help="seconds to run (0: until Ctrl-C)")
    parser.add_argument("--keep", action="store_true", help="do not unregister at the end")


def run(endpoints: list[str], args: argparse.Namespace, timeout: float = 10.0) -> int:
    if args.brokers < 1 or args.topics < 0 or args.interval <= 0:
        print("nsctl: error: need --brokers >= 1, --topics >= 0, --interval > 0", file=sys.stderr)
        return 2
    agents = make_agents(args.brokers, args.topics, cluster=args.cluster, prefix=args.prefix,
                         topic_prefix=args.topic_prefix, queues=args.queues, timeout_ms=args.timeout_ms,
                         shared=not args.own_topics)
    client = Client(endpoints, retry=RetryPolicy(deadline_s=max(timeout, 2 * args.interval)))
    fleet = BrokerFleet(client, agents, heartbeat_interval_s=args.interval)
    started = time.monotonic()
    fleet.start()
    print(f"simulating {args.brokers} broker(s) x {args.topics} topic(s) in {args.cluster}, "
          f"heartbeat every {args.interval:g} s; Ctrl-C stops", flush=True)
    try:
        while args.duration <= 0 or time.monotonic() - started < args.duration:
            # every 5 s, and once more at the end of --duration (not up to 5 s past it)
            left = args.duration - (time.monotonic() - started) if args.duration > 0 else 5.0
            time.sleep(min(5.0, max(0.0, left)))
            print(_summary(agents, time.monotonic() - started, client), flush=True)
    except KeyboardInterrupt:
        pass
    finally:
        done = fleet.stop(unregister=not args.keep)
        print(f"stopped; unregistered {done} broker(s)", flush=True)
        client.close()
    return 0


def _summary(agents: list[BrokerAgent], elapsed: float, client: Client) -> str:
    stats: dict[str, Any] = {
        "registered": sum(a.registered for a in agents),
        "registrations": sum(a.stats.registrations for a in agents),
        "re-registrations": sum(a.stats.reregistrations for a in agents),
        "heartbeats": sum(a.stats.heartbeats for a in agents),
        "failures": sum(a.stats.failures for a in agents),
        "retries": client.retries,
    }
    return f"[{elapsed:6.1f}s] " + ", ".join(f"{k} {v}" for k, v in stats.items()) + \
        f", leader {client.pool.leader or '?'}, offset {client.last_offset}"
