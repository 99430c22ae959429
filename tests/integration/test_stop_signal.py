"""A node stops on SIGTERM whichever of its threads the kernel hands the signal to.

POSIX lets the kernel deliver a process's signal to any thread that does not block it. The test
sends SIGTERM to one of the node's non-main threads (tgkill): before nameserver/ops/stopsignal.py the
main thread waited in an untimed Event.wait() that nothing woke, and the node kept serving (a rolling
restart's SIGTERM went unanswered for 15 s). The bound is not a speed target: a node acting on the
signal stops in about a second.
"""

from __future__ import annotations

import ctypes
import errno
import os
import signal

import pytest

from tests.cluster import NodeProc

pytestmark = pytest.mark.cluster

STOP_BOUND_S = 10


def signal_other_thread(node: NodeProc, sig: int) -> int:
    """Send `sig` to one of the node's threads other than its main thread; that thread's id."""
    assert node.proc is not None
    pid = node.proc.pid
    libc = ctypes.CDLL(None, use_errno=True)
    for tid in sorted((int(t) for t in os.listdir(f"/proc/{pid}/task") if int(t) != pid), reverse=True):
        if libc.tgkill(pid, tid, sig) == 0:  # glibc >= 2.30 wraps the syscall
            return tid
        assert ctypes.get_errno() == errno.ESRCH, os.strerror(ctypes.get_errno())  # that thread just ended
    raise AssertionError("the node has no thread besides its main thread")


def test_sigterm_taken_by_another_thread_stops_the_node(make_cluster) -> None:
    cluster = make_cluster(1)
    cluster.wait_ready(timeout=60)
    node = cluster.nodes[0]
    signal_other_thread(node, signal.SIGTERM)
    assert node.proc is not None
    node.proc.wait(timeout=STOP_BOUND_S)  # TimeoutExpired: the signal was never acted on
    assert node.proc.returncode == 0
    with open(node.log_path) as f:
        assert "stopping" in f.read()
