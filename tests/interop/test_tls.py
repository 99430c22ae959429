"""Real RocketMQ brokers, mqadmin, a producer and a push consumer, all with `tls.enable=true`, against our
nameserver's remoting port in `[remoting] tls = "enforcing"` mode: a plain connection would be closed,
so every exchange with the nameservers was TLS. Both lines."""

from __future__ import annotations

import time

import pytest

from nameserver import tlsconf
from nameserver.pb import api_pb2
from tests.certs import TestCA

from .conftest import CLUSTER, deploy
from .traffic import Consumer

pytestmark = pytest.mark.interop

N = 10
TLS = {"tls.enable": "true"}  # RocketMQ's client side; it trusts any server certificate (tls.test.mode)


def test_tls_brokers_and_clients_through_an_enforcing_port(line: str, tmp_path) -> None:
    ca = TestCA(str(tmp_path / "pki"))
    node = ca.node()
    d = deploy(line, str(tmp_path / "d"), brokers=False,
               security={"tls": {"cert_file": node.cert, "key_file": node.key, "ca_file": ca.ca_file},
                         "remoting": {"tls": "enforcing"}},
               connect=lambda addr, opts=(): tlsconf.open_channel(addr, tls=True, ca_file=ca.ca_file, options=opts))
    try:
        d.brokers = {"a0": d.rmq.broker("broker-a", d.namesrv, 0, CLUSTER, props=TLS)}
        # registered on every node (asked over gRPC: the remoting port takes TLS only)
        deadline = time.monotonic() + 90
        while not all("broker-a" in n.ns.GetClusterInfo(api_pb2.GetClusterInfoRequest(), timeout=5).broker_addr_table
                      for n in d.ours.nodes):
            assert time.monotonic() < deadline, "broker-a (tls.enable=true) did not register\n" + d.logs()
            time.sleep(0.5)
        topic = "InteropTlsTopic"
        r = d.rmq.mqadmin("updateTopic", "-c", CLUSTER, "-t", topic, "-r", "4", "-w", "4", namesrv=d.namesrv,
                          props=TLS)
        assert r.returncode == 0 and "success" in r.stdout, f"{r.stdout}\n{r.stderr[-2000:]}"
        consumer = d.rmq.client("consume", d.namesrv, topic, "interop-cg-tls", "t1", name="consumer-tls", props=TLS)
        consumer.wait_line(lambda ln: ln == "READY", timeout=90)
        p = d.rmq.client("produce", d.namesrv, topic, str(N), "interop-producer-tls", "0", "tls",
                         name="producer-tls", props=TLS)
        p.wait_line(lambda ln: ln.startswith("DONE "), timeout=180)
        sent = [ln.split()[1] for ln in p.snapshot() if ln.startswith("SENT ")]
        assert len(sent) == N, p.tail()
        Consumer(consumer).wait_received(set(sent))
        # and a plain client is refused by the same port
        plain = d.rmq.mqadmin("clusterList", namesrv=d.namesrv)
        assert "broker-a" not in plain.stdout, plain.stdout
    finally:
        d.stop()
