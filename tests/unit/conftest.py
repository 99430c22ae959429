"""Fixtures shared by the unit tests that need a real node in this process."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from concurrent import futures
from typing import Any

import grpc
import pytest

from nameserver.api.logservice import LogService
from nameserver.config import Member, NodeConfig
from nameserver.core import NameServerNode
from nameserver.localports import free_ports
from nameserver.pb import api_pb2_grpc


@pytest.fixture
def node(tmp_path) -> Iterator[NameServerNode]:
    """A one-node NameServerNode (its Raft and gRPC ports free on 127.0.0.1), once it leads and is ready."""
    raft, grpc_port = free_ports(2)
    cfg = NodeConfig(raft_addr=f"127.0.0.1:{raft}", grpc_addr=f"127.0.0.1:{grpc_port}", data_dir=str(tmp_path),
                     members=[Member(f"127.0.0.1:{raft}", f"127.0.0.1:{grpc_port}")])
    n = NameServerNode(cfg)
    deadline = time.monotonic() + 30
    while not (n.log.is_leader() and n.log.ready):
        assert time.monotonic() < deadline, "the one-node cluster did not elect itself"
        time.sleep(0.05)
    yield n
    n.close()


@pytest.fixture
def serve_grpc() -> Iterator[Callable[[Callable[[grpc.Server], object]], str]]:
    """Start an in-process gRPC server on 127.0.0.1 with what `add(server)` adds to it; returns its address."""
    servers = []

    def start(add: Callable[[grpc.Server], object]) -> str:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        add(server)
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        servers.append(server)
        return f"127.0.0.1:{port}"

    yield start
    for s in servers:
        s.stop(0)


@pytest.fixture
def serve_log(serve_grpc) -> Callable[[Any], str]:
    """Serve the Log service over a stand-in node on an in-process gRPC server; returns its address."""
    return lambda node: serve_grpc(lambda server: api_pb2_grpc.add_LogServicer_to_server(LogService(node), server))
