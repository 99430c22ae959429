"""Fixtures shared by the unit tests that need a real node in this process."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from nameserver.config import Member, NodeConfig
from nameserver.core import NameServerNode
from nameserver.localports import free_ports


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
