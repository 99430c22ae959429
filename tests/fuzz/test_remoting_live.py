"""Random and mutated frames sent to a real node's RocketMQ remoting listener.

Each example uses a fresh connection (a malformed frame closes it, by design). A well-formed request
must get its response (matched by opaque) on that connection; anything else may close it. Afterwards
every node still answers both protocols, and the three nodes hold the same state.
"""

from __future__ import annotations

import socket
import struct
import time

from hypothesis import given
from hypothesis import strategies as st

from nameserver.remoting import codes, frame
from nameserver.remoting.command import Command, FrameError
from tests.cluster import Cluster, NodeProc
from tests.fuzz import remotingstrategies as rs
from tests.fuzz.profile import fuzz_settings

ANSWER_S = 10.0  # a request taking the Raft path on a loaded machine


def _split(addr: str) -> tuple[str, int]:
    host, port = addr.rsplit(":", 1)
    return host, int(port)


def _read_frames(sock: socket.socket, until: float, want: int) -> list[Command] | None:
    """Response frames until `want` arrived, the server closes or the time is up; None if the bytes
    are not whole response frames."""
    buf = b""
    while time.monotonic() < until and (want == 0 or _count(buf) < want):
        sock.settimeout(max(0.01, until - time.monotonic()))
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            break
        except ConnectionError:
            break
        if not chunk:
            break
        buf += chunk
    out = []
    while len(buf) >= 4:
        (n,) = struct.unpack(">i", buf[:4])
        if len(buf) < 4 + n:
            return None
        try:
            out.append(frame.decode(buf[4:4 + n]))
        except FrameError:
            return None
        buf = buf[4 + n:]
    return out if not buf else None


def _count(buf: bytes) -> int:
    """Whole frames in buf."""
    n = 0
    while len(buf) >= 4:
        size = struct.unpack(">i", buf[:4])[0]
        if size < 0 or len(buf) < 4 + size:
            break
        buf = buf[4 + size:]
        n += 1
    return n


def _exchange(node: NodeProc, data: bytes, wait_s: float, want: int = 0) -> list[Command] | None:
    # No half-close after sending: like Netty, the server closes on end of stream, in-flight answers too.
    with socket.create_connection(_split(node.remoting_addr), timeout=5) as sock:
        try:
            sock.sendall(data)
        except ConnectionError:
            return []
        return _read_frames(sock, time.monotonic() + wait_s, want)


def _expects_answer(data: bytes) -> Command | None:
    """The request a well-formed single frame holds, when it must be answered."""
    if len(data) < 4 or struct.unpack(">i", data[:4])[0] != len(data) - 4:
        return None
    try:
        cmd = frame.decode(data[4:])
    except FrameError:
        return None
    return None if cmd.is_oneway or cmd.is_response else cmd


def _cluster_info(node: NodeProc) -> Command:
    req = Command(code=codes.GET_BROKER_CLUSTER_INFO, language="JAVA", version=479, opaque=4242)
    got = _exchange(node, frame.encode(req), ANSWER_S, want=1)
    assert got and got[0].opaque == 4242, f"{node.name}: no answer to a plain request after the fuzzing"
    return got[0]


@fuzz_settings(40)
@given(st.data())
def test_random_frames_to_a_live_listener(fuzz_cluster: Cluster, data: st.DataObject) -> None:
    node = data.draw(st.sampled_from(fuzz_cluster.nodes), label="node")
    payload = data.draw(st.one_of(rs.frames(), rs.raw_json_frames(), rs.mutated(), st.binary(max_size=64)),
                        label="bytes")
    request = _expects_answer(payload)
    responses = _exchange(node, payload, ANSWER_S if request is not None else 0.3, want=int(request is not None))
    assert responses is not None, "the server wrote bytes that are not response frames"
    assert all(r.is_response for r in responses)
    if request is not None:
        assert [r.opaque for r in responses] == [request.opaque], f"code {request.code}: no response"
    assert node.status(timeout=5) is not None, f"{node.name} stopped answering gRPC"


def test_nodes_still_serve_and_agree(fuzz_cluster: Cluster) -> None:
    for node in fuzz_cluster.nodes:
        assert _cluster_info(node).code == codes.SUCCESS
    fuzz_cluster.wait_converged(timeout=30)
