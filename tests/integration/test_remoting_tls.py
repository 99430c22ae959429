"""TLS on the remoting port ([remoting] tls, RocketMQ's tls.server.mode), over real sockets to real nodes.

One single-node cluster per mode: permissive (the default with a certificate) serves plain and TLS
clients on one port; enforcing closes plain ones; off never speaks TLS. A bad handshake closes only its
own connection, and the node keeps serving.
"""

from __future__ import annotations

import contextlib
import json
import socket
import ssl
from collections.abc import Iterator

import pytest

from nameserver import tlsconf
from nameserver.remoting import frame
from nameserver.remoting.command import Command
from tests.certs import TestCA
from tests.cluster import Cluster
from tests.fakebroker import read_frame

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> TestCA:
    return TestCA(str(tmp_path_factory.mktemp("remoting-pki")))


@pytest.fixture(scope="module", params=["default", "enforcing", "off"])
def node(request: pytest.FixtureRequest, ca: TestCA, tmp_path_factory: pytest.TempPathFactory
         ) -> Iterator[tuple[str, str]]:
    """(mode, remoting address) of a one-node cluster with a certificate; "default" sets no [remoting] tls."""
    files = ca.node()
    security: dict = {"tls": {"cert_file": files.cert, "key_file": files.key, "ca_file": ca.ca_file}}
    if request.param != "default":
        security["remoting"] = {"tls": request.param}
    c = Cluster(str(tmp_path_factory.mktemp(f"remoting-tls-{request.param}")), 1, remoting=True, security=security,
                connect=lambda addr, opts=(): tlsconf.open_channel(addr, tls=True, ca_file=ca.ca_file, options=opts))
    c.start()
    try:
        c.wait_ready(timeout=60)
        yield request.param, c.nodes[0].remoting_addr
    finally:
        c.stop(wait=False)  # the nodes shut down while the next test starts


def _connect(addr: str, ca: TestCA | None) -> socket.socket:
    host, port = addr.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=10)
    if ca is None:
        return sock
    ctx = ssl.create_default_context(cafile=ca.ca_file)  # verifies the node's certificate and its name
    return ctx.wrap_socket(sock, server_hostname=host)


def _cluster_info(sock: socket.socket) -> dict:
    """GET_BROKER_CLUSTER_INFO (106) on an open connection."""
    sock.sendall(frame.encode(Command(code=106, opaque=7)))
    payload = read_frame(sock)
    assert payload is not None, "the node closed the connection"
    resp = frame.decode(payload)
    assert (resp.code, resp.opaque) == (0, 7)
    return json.loads(resp.body)


def test_plain_and_tls_clients_by_mode(node: tuple[str, str], ca: TestCA) -> None:
    mode, addr = node
    if mode in ("default", "enforcing"):
        with _connect(addr, ca) as tls:
            assert "brokerAddrTable" in _cluster_info(tls)
            assert tls.version() in ("TLSv1.2", "TLSv1.3")
    else:  # off: a TLS client's hello is read as a (bad) frame and the connection closes
        with pytest.raises((ssl.SSLError, ConnectionError, OSError)), _connect(addr, ca):
            pass
    with _connect(addr, None) as plain:
        if mode == "enforcing":  # closed without an answer
            with contextlib.suppress(ConnectionError):  # it may be closed already
                plain.sendall(frame.encode(Command(code=106, opaque=7)))
            assert _closed_by_peer(plain)
        else:
            assert "brokerAddrTable" in _cluster_info(plain)


def _closed_by_peer(sock: socket.socket, timeout: float = 10.0) -> bool:
    """The other side closes (EOF or reset) within `timeout`; what it sends first (a TLS alert) is read."""
    sock.settimeout(timeout)
    try:
        while sock.recv(4096):
            pass
    except ConnectionResetError:
        pass
    except TimeoutError:
        return False
    return True


def test_a_bad_handshake_closes_only_its_connection(node: tuple[str, str], ca: TestCA) -> None:
    mode, addr = node
    with _connect(addr, None) as junk:  # a handshake record's header, then garbage (in mode off: a bad frame)
        junk.sendall(b"\x16\x03\x01\x00\x40" + b"\x00" * 64)
        assert _closed_by_peer(junk), "the node kept a connection that sent a broken handshake"
    with _connect(addr, ca if mode != "off" else None) as sock:  # and still serves the next one
        assert "brokerAddrTable" in _cluster_info(sock)
