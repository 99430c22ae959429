"""The load loop every benchmark drives: one thread per client, each with its own channel, timed calls,
and the client's and the servers' CPU use (bench/workloads.py's targets, bench/echo.py's --compare,
bench/suite.py, bench/stability.py). It knows no target: a worker is handed its channel and operation.
"""

from __future__ import annotations

import os
import platform
import resource
import threading
import time
from collections.abc import Callable
from typing import Any

import grpc

from bench.consistency import summary

Op = Callable[[], int]  # one operation; returns the records it committed (0 for reads and echoes)


def new_channel(addr: str) -> grpc.Channel:
    return grpc.insecure_channel(addr, options=[
        ("grpc.use_local_subchannel_pool", 1),  # its own connection: independent clients, not one multiplexed
        ("grpc.max_receive_message_length", 64 << 20), ("grpc.max_send_message_length", 64 << 20)])


def cpu_model() -> str:
    """This machine's CPU model name, for a report's header."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine_busy_s() -> float:
    """CPU seconds every core of the machine spent busy so far, whoever's (Linux /proc/stat: user, nice,
    system and steal time, as a process's utime and stime count it; not the kernel's interrupt time)."""
    with open("/proc/stat") as f:
        fields = f.readline().split()
    if not fields or fields[0] != "cpu":
        raise RuntimeError(f"/proc/stat does not start with the machine's cpu line: {' '.join(fields[:3])!r}")
    user, nice, system, _idle, _iowait, _irq, _softirq, steal = (int(x) for x in (fields[1:9] + ["0"] * 8)[:8])
    return (user + nice + system + steal) / os.sysconf("SC_CLK_TCK")


def proc_cpu_s(pids: list[int]) -> float:
    """User + system CPU seconds of the given processes so far (Linux /proc)."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of stat)
        except (OSError, IndexError, ValueError):
            pass
    return total / os.sysconf("SC_CLK_TCK")


def _self_cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def run_load(make: Callable[[int], tuple[grpc.Channel, Op]], threads: int, seconds: float,
             server_pids: list[int] | None = None, group: Callable[[int], str] | None = None) -> dict[str, Any]:
    """Run `threads` workers for `seconds`; worker i gets (channel, op) from make(i) in its own thread.

    Connections are made and ready before the clock starts (a barrier), so connection setup is not in
    the latencies. Returns the summary of successful ops plus records, errors and CPU use, and per
    group (e.g. per node) when `group` names each worker's group.
    """
    lat: list[list[float]] = [[] for _ in range(threads)]
    records = [0] * threads
    errors = [0] * threads
    ends = [0.0] * threads
    first_error: list[str] = []
    marks: dict[str, float] = {}

    def begin() -> None:  # runs once, when every worker is connected, before any is released
        marks["t0"] = time.monotonic()
        marks["cpu0"] = _self_cpu_s()
        marks["srv0"] = proc_cpu_s(server_pids or [])

    barrier = threading.Barrier(threads, action=begin)

    def worker(i: int) -> None:
        channel: grpc.Channel | None = None
        try:
            channel, op = make(i)
            grpc.channel_ready_future(channel).result(timeout=15)
            barrier.wait(timeout=60)
        except Exception as exc:  # setup failed: release everyone, the run reports it
            first_error.append(f"setup: {exc!r}")
            barrier.abort()
            if channel is not None:
                channel.close()
            return
        stop = marks["t0"] + seconds
        my_lat = lat[i]
        try:
            while time.monotonic() < stop:
                t0 = time.perf_counter()
                try:
                    n = op()
                except Exception as exc:  # counted and reported; a run with errors is not a clean figure
                    errors[i] += 1
                    if not first_error:
                        first_error.append(f"{exc.code().name}: {exc.details()}" if isinstance(exc, grpc.RpcError)
                                           else repr(exc))
                    time.sleep(0.01)
                    continue
                my_lat.append(time.perf_counter() - t0)
                records[i] += n
        finally:
            ends[i] = time.monotonic()
            channel.close()

    # Daemon threads: a SIGTERM'd harness exits (stopping its clusters) without waiting out the load.
    ts = [threading.Thread(target=worker, args=(i,), name=f"load-{i}", daemon=True) for i in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    if "t0" not in marks:
        raise RuntimeError(f"load did not start: {first_error[0] if first_error else 'unknown'}")
    elapsed = max(ends) - marks["t0"]
    all_lat = [x for per in lat for x in per]
    out: dict[str, Any] = {"threads": threads, "seconds": round(elapsed, 2), **summary(all_lat, elapsed)}
    out["records"] = sum(records)
    out["records_per_s"] = round(sum(records) / elapsed, 1)
    out["errors"] = sum(errors)
    if first_error:
        out["first_error"] = first_error[0]
    # CPU cores busy on average, and CPU per operation: the client (this process: load threads, GIL-bound)
    # and the servers.
    client_s = _self_cpu_s() - marks["cpu0"]
    out["client_cpu_cores"] = round(client_s / elapsed, 2)
    out["client_us_per_op"] = round(client_s / len(all_lat) * 1e6, 1) if all_lat else 0.0
    if server_pids:
        server_s = proc_cpu_s(server_pids) - marks["srv0"]
        out["server_cpu_cores"] = round(server_s / elapsed, 2)
        out["server_us_per_op"] = round(server_s / len(all_lat) * 1e6, 1) if all_lat else 0.0
    if group is not None:
        names = [group(i) for i in range(threads)]
        out["per_node"] = {name: {"threads": names.count(name),
                                  **summary([x for i in range(threads) if names[i] == name for x in lat[i]],
                                            elapsed)}
                           for name in sorted(set(names))}
    return out
