"""A real Apache RocketMQ broker, producer, consumer and mqadmin against a running cluster (the README's
"With real RocketMQ" tour). Start the cluster first (`make run`), then:

    make rocketmq-tour                                   # = python -m tests.interop.tour
    .venv/bin/python -m tests.interop.tour --version 4.9.7 --messages 50
    .venv/bin/python -m tests.interop.tour mqadmin clusterList       # any mqadmin command, -n filled in

The tour fetches the jars (tests/interop/jars.py), starts one broker registered with every node, makes a
topic with mqadmin, sends N messages with the Java producer, receives them with a push consumer, shows
the route every node serves, then stops the broker (it unregisters) and shows it gone. Its files (broker
store, logs) are under a temporary directory, removed at the end unless --keep.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time

from . import jars, remoting
from .launcher import RocketMQ

LOCAL_3 = "127.0.0.1:9876;127.0.0.1:9877;127.0.0.1:9878"  # deploy/local-3's remoting ports (make run)
CLUSTER = "TourCluster"


def step(text: str) -> None:
    print(f"\n== {text}", flush=True)


def _cluster_brokers(addr: str) -> dict[str, list[str]]:
    info = remoting.cluster_info(addr)
    return {name: sorted(bd["brokerAddrs"].values()) for name, bd in info.get("brokerAddrTable", {}).items()}


def _wait(pred, what: str, timeout: float = 60.0) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise SystemExit(f"tour: {what} did not happen within {timeout:.0f} s")
        time.sleep(0.5)


def _reachable(addrs: list[str]) -> None:
    for a in addrs:
        try:
            remoting.cluster_info(a)
        except OSError as exc:
            raise SystemExit(f"tour: no nameserver answers at {a} ({exc}); start the cluster first: make run") from None


def tour(rmq: RocketMQ, namesrv: str, messages: int) -> None:
    addrs = namesrv.split(";")
    _reachable(addrs)
    step(f"a real RocketMQ {rmq.version} broker, namesrvAddr={namesrv}")
    broker = rmq.broker("tour-broker", namesrv, 0, CLUSTER)
    print(f"broker-0 of tour-broker listens on {broker.addr}")
    _wait(lambda: all(broker.addr in _cluster_brokers(a).get("tour-broker", []) for a in addrs),
          "the broker's registration on every node")
    for a in addrs:
        print(f"{a}: GET_BROKER_CLUSTER_INFO lists {_cluster_brokers(a)}")

    topic = "TourTopic"
    step(f"mqadmin updateTopic -c {CLUSTER} -t {topic}")
    r = rmq.mqadmin("updateTopic", "-c", CLUSTER, "-t", topic, "-r", "4", "-w", "4", namesrv=namesrv)
    print(r.stdout.strip())
    _wait(lambda: all(remoting.route(a, topic) is not None for a in addrs), "the topic's route on every node")
    print(f"{addrs[-1]}: route of {topic}: {json.dumps(remoting.route(addrs[-1], topic)['queueDatas'])}")

    step(f"a push consumer subscribes, a producer sends {messages} messages (sync)")
    consumer = rmq.client("consume", namesrv, topic, "tour-consumers", "c1", name="consumer")
    consumer.wait_line(lambda ln: ln == "READY", timeout=90)
    producer = rmq.client("produce", namesrv, topic, str(messages), "tour-producers", "0", "tour", name="producer")
    done = producer.wait_line(lambda ln: ln.startswith("DONE "), timeout=300)
    print(f"producer: {done}")
    sent = {ln.split()[1] for ln in producer.snapshot() if ln.startswith("SENT ")}
    _wait(lambda: sent <= {ln.split()[1] for ln in consumer.snapshot() if ln.startswith("RECV ")},
          "the consumer's receipt of every message", timeout=120)
    print(f"consumer: received all {len(sent)} messages")
    consumer.stop()

    step("mqadmin clusterList and topicRoute, through our nameservers")
    for args in (("clusterList",), ("topicRoute", "-t", topic)):
        print(f"$ mqadmin {' '.join(args)} -n '{namesrv}'")
        print(rmq.mqadmin(*args, namesrv=namesrv).stdout.strip())

    step("the broker shuts down (SIGTERM): it unregisters, and every node drops it")
    broker.proc.stop(grace=30)
    _wait(lambda: all("tour-broker" not in _cluster_brokers(a) for a in addrs), "the broker's removal")
    for a in addrs:
        print(f"{a}: GET_BROKER_CLUSTER_INFO lists {_cluster_brokers(a)}")
    print("\ntour done")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.interop.tour", description=__doc__.split("\n\n")[0])
    parser.add_argument("--namesrv", default=LOCAL_3, help=f"our remoting addresses, ';'-separated ({LOCAL_3})")
    parser.add_argument("--version", default=jars.LINE_5, choices=jars.LINES, help="RocketMQ line")
    parser.add_argument("--messages", type=int, default=10)
    parser.add_argument("--keep", action="store_true", help="keep the broker's store and logs")
    parser.add_argument("mqadmin", nargs=argparse.REMAINDER,
                        help="`mqadmin CMD ARGS...`: run one mqadmin command against --namesrv instead")
    args = parser.parse_args(argv)
    jars.ensure(args.version)
    root = tempfile.mkdtemp(prefix="rocketmq-tour-")
    rmq = RocketMQ(args.version, root)
    try:
        if args.mqadmin:
            if args.mqadmin[0] != "mqadmin" or len(args.mqadmin) < 2:
                parser.error("usage: ... mqadmin COMMAND [ARGS...]")
            r = rmq.mqadmin(*args.mqadmin[1:], namesrv=args.namesrv)
            sys.stdout.write(r.stdout)
            sys.stderr.write(r.stderr)
            return r.returncode
        tour(rmq, args.namesrv, args.messages)
        return 0
    finally:
        rmq.stop_all()
        if args.keep:
            print(f"files kept in {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
