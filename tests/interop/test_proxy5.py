"""RocketMQ 5 through its proxy: the proxy (cluster mode) takes routes from our nameserver, and PyPI's
rocketmq-python-client (the 5.x gRPC client) sends and receives through it. 5.x only: 4.9 has no proxy."""

from __future__ import annotations

import os

import pytest

from . import jars, py5client
from .conftest import Deployment
from .traffic import create_topic

pytestmark = pytest.mark.interop

N = 20


@pytest.mark.parametrize("line", [jars.LINE_5], indirect=True)  # 4.9 has no proxy: not collected there
def test_python_grpc_client_through_the_proxy(line: str, deployment: Deployment, tmp_path) -> None:
    d = deployment
    topic = "InteropProxyTopic"
    create_topic(d, topic)
    proxy, endpoint = d.rmq.proxy(d.namesrv)
    try:
        res = py5client.send_and_receive(endpoint, topic, "interop-cg-proxy", N, os.path.join(tmp_path, "py5"))
    finally:
        proxy.stop()
    assert not res["failed"], res["failed"][:5]
    assert len(res["sent"]) == N
    assert set(res["received"]) == set(res["sent"]), res
