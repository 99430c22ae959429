"""`scaling`: the same jobs on the same log with more Spark executors, side by side in one run.

    python -m pipeline scaling --records 10000000 --work /tmp/scale

For each configuration (`local[N]`, or `standalone:N`: a standalone master with N one-core workers started
here by pipeline/standalone.py) it runs `python -m pipeline bench --jobs walk,compact,audit` in a fresh
driver process, and samples the resident memory of the driver's process tree (driver JVM and Python
workers) and, for a standalone cluster, of the workers' trees (worker and executor JVMs, their Python
workers) once a second. The log and the replay's dump are made once, before the first configuration.
Prints a Markdown table and writes WORK/scaling.json.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from typing import Any

from pipeline import standalone
from pipeline.bench import machine


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            kids.setdefault(ppid, []).append(int(name))
    return kids


def _rss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))
    except (OSError, StopIteration, ValueError):
        return 0


def tree_rss(roots: list[int]) -> int:
    """Resident bytes of the processes `roots` and all their descendants."""
    kids = _children()
    seen, todo, total = set(), list(roots), 0
    while todo:
        pid = todo.pop()
        if pid not in seen:
            seen.add(pid)
            total += _rss(pid)
            todo += kids.get(pid, [])
    return total


class PeakMemory:
    """Samples tree_rss of two groups of processes once a second; keeps the peaks."""

    def __init__(self, driver: list[int], cluster: list[int]) -> None:
        self.driver, self.cluster = driver, cluster
        self.peak_driver = self.peak_cluster = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            self.peak_driver = max(self.peak_driver, tree_rss(self.driver))
            if self.cluster:
                self.peak_cluster = max(self.peak_cluster, tree_rss(self.cluster))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def run_scaling(records: int, work: str, configs: list[str], worker_memory: str, driver_memory: str
                ) -> dict[str, Any]:
    os.makedirs(work, exist_ok=True)
    # The log and the replay's dump, once (not timed here: bench.json of this step has their times).
    subprocess.run([sys.executable, "-m", "pipeline", "bench", "--records", str(records), "--work", work,
                    "--master", "local[2]", "--jobs", "", "--result", os.path.join(work, "prepare.json"),
                    "--driver-memory", driver_memory], check=True)
    rows = []
    for config in configs:
        cluster_dir = os.path.join(work, "spark-standalone")
        cluster = None
        extra = ["--driver-memory", driver_memory]
        master = config
        if config.startswith("standalone:"):
            workers = int(config.split(":", 1)[1])
            cluster = standalone.start(cluster_dir, workers=workers, cores=1, memory=worker_memory, port=7077,
                                       venv=os.path.expanduser("~/.cache/rip18/spark-executor"))
            executor_memory = f"{max(1, int(worker_memory.rstrip('g')) - 1)}g"
            master = cluster.master_url
            extra = ["--executor-python", cluster.executor_python, "--driver-memory", "2g",
                     "--conf", f"spark.executor.memory={executor_memory}",
                     "--conf", f"spark.sql.shuffle.partitions={4 * workers * 2}"]
        result = os.path.join(work, f"scaling-{config.replace(':', '-').replace('[', '').replace(']', '')}.json")
        t0 = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-m", "pipeline", "bench", "--records", str(records), "--work", work,
                                 "--master", master, "--jobs", "walk,compact,audit", "--result", result, *extra])
        peaks = PeakMemory([proc.pid], cluster.pids if cluster else [])
        code = proc.wait()
        peaks.stop()
        wall = time.perf_counter() - t0
        if cluster is not None:
            standalone.stop(cluster_dir)
        if code != 0:
            raise RuntimeError(f"bench on {config} failed (exit {code})")
        with open(result) as f:
            info = json.load(f)
        secs = info["seconds"]
        rows.append({"config": config, "core_s": secs["conditional core extracted"],
                     "walk_s": secs["precondition walk (components + walk in executors)"],
                     "compact_s": secs["compact"], "audit_s": secs["audit (compact + key diff vs the replay's dump)"],
                     "session_s": secs["spark session start"], "wall_s": round(wall, 1),
                     "driver_peak_gib": round(peaks.peak_driver / 2**30, 2),
                     "cluster_peak_gib": round(peaks.peak_cluster / 2**30, 2),
                     "digest_ok": info.get("digest_equal_to_replay"), "audit_ok": info.get("audit_ok"),
                     "walk": info.get("walk")})
    with open(os.path.join(work, "prepare.json")) as f:
        prepared = json.load(f)
    out = {"date": time.strftime("%Y-%m-%d"), "machine": machine(), "records": records, "rows": rows,
           "replay": prepared.get("replay")}
    with open(os.path.join(work, "scaling.json"), "w") as f:
        json.dump(out, f, indent=1)
    print(markdown(out))
    return out


def markdown(out: dict[str, Any]) -> str:
    lines = [f"{out['date']}, {out['machine']}, {out['records']:,} records wanted.", "",
             "| Spark | core, s | walk, s | compact, s | audit, s | driver peak RSS, GiB "
             "| workers + executors peak RSS, GiB | digest = replay, audit OK |", "|---|---|---|---|---|---|---|---|"]
    for r in out["rows"]:
        lines.append(f"| {r['config']} | {r['core_s']} | {r['walk_s']} | {r['compact_s']} | {r['audit_s']} | "
                     f"{r['driver_peak_gib']} | "
                     f"{r['cluster_peak_gib'] or '-'} | {r['digest_ok']}, {r['audit_ok']} |")
    return "\n".join(lines)
