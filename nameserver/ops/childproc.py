"""What a process started by the core (a remoting worker, a group core) does so that it never outlives it:
the kernel kills it when the core dies (PR_SET_PDEATHSIG), and it stops at the end of its stdin, the pipe
the core holds open (nameserver/ops/workers.py)."""

from __future__ import annotations

import argparse
import ctypes
import os
import pickle
import signal
import sys
import threading
from typing import Any

PR_SET_PDEATHSIG = 1


def started(prog: str, description: str, flag: str, argv: list[str] | None) -> tuple[int, Any]:
    """A child's start: its `flag` number from argv (`--core-pid` too), bound to die with its core, and
    what the core wrote on its stdin (a WorkerSpec: pickled, over the pipe only the core holds)."""
    p = argparse.ArgumentParser(prog=prog, description=description)
    p.add_argument(flag, type=int, required=True)
    p.add_argument("--core-pid", type=int, required=True)
    args = p.parse_args(argv)
    die_with(args.core_pid)
    return getattr(args, flag.lstrip("-").replace("-", "_")), pickle.load(sys.stdin.buffer)


def die_with(core_pid: int) -> None:
    """Have the kernel kill this process when the core dies; exit now if it already has."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the end of stdin still stops it
        pass
    if os.getppid() != core_pid:
        sys.exit(0)


def until_eof(stopped: threading.Event) -> None:
    """Set `stopped` at the end of stdin (the core is gone); run on a thread of its own."""
    try:
        while sys.stdin.buffer.read(4096):
            pass
    except OSError:
        pass
    stopped.set()


def stop_with_core(stopped: threading.Event) -> None:
    threading.Thread(target=until_eof, args=(stopped,), name="core-pipe", daemon=True).start()


def tell_core(line: bytes) -> None:
    """A line on stdout for the core's supervisor (workers.SERVING)."""
    try:
        sys.stdout.buffer.write(line)
        sys.stdout.buffer.flush()
    except (OSError, ValueError):  # the core is gone: the end of stdin stops this process
        pass
