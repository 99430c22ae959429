"""A Spark standalone cluster on this machine: one master and N workers, each its own JVM.

    python -m pipeline standalone start --dir build/spark [--workers 2 --cores 1 --memory 1536m --port 7077]
    python -m pipeline compact --master spark://127.0.0.1:7077 \\
        --executor-python build/spark/executor-python/bin/python --log DIR
    python -m pipeline standalone stop --dir build/spark

The processes come from the PySpark distribution's own `bin/spark-class` (Master and Worker), as
`sbin/start-master.sh` would start them, bound to 127.0.0.1, with their logs, work and shuffle
directories under --dir. `start` returns once every worker has registered with the master.

Executors run the Python given by --executor-python. `start` makes one, as a real cluster's nodes are
provisioned: a virtualenv holding only what the executors import from outside the pipeline (pandas,
pyarrow, numpy, protobuf, at the driver's versions), never this project. The jobs ship the pipeline
to the executors themselves (pipeline/ship.py), so what would break on a remote cluster (a module not in
the zip, a closure over a driver-only object) breaks here too.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from importlib import metadata

from nameserver.localports import free_port

STATE_FILE = "cluster.json"
EXECUTOR_PACKAGES = ("pandas", "pyarrow", "numpy", "protobuf")  # what the executors import from outside
_DEPLOY = "org.apache.spark.deploy"


class StandaloneError(Exception):
    """The cluster could not be started or reached."""


@dataclass
class Cluster:
    dir: str
    master_url: str
    web_url: str
    executor_python: str
    pids: list[int] = field(default_factory=list)  # master first


def spark_home() -> str:
    import pyspark

    return os.path.dirname(os.path.abspath(pyspark.__file__))


def _spark_class() -> str:
    return os.path.join(spark_home(), "bin", "spark-class")


def executor_python(venv: str) -> str:
    """A virtualenv at `venv` with EXECUTOR_PACKAGES at this interpreter's versions; its python."""
    python = os.path.join(venv, "bin", "python")
    pins = [f"{p}=={metadata.version(p)}" for p in EXECUTOR_PACKAGES]
    stamp = os.path.join(venv, ".pins")
    if os.path.exists(stamp):
        with open(stamp) as f:
            if f.read() == "\n".join(pins):
                return python
    shutil.rmtree(venv, ignore_errors=True)
    base = getattr(sys, "_base_executable", None) or sys.executable  # the interpreter, not this venv's
    subprocess.run([base, "-m", "venv", venv], check=True)
    subprocess.run([python, "-m", "pip", "install", "-q", "--disable-pip-version-check", *pins], check=True)
    with open(stamp, "w") as f:
        f.write("\n".join(pins))
    return python


def _env(directory: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(SPARK_HOME=spark_home(), SPARK_LOCAL_IP="127.0.0.1", SPARK_NO_DAEMONIZE="1",
               SPARK_LOCAL_DIRS=os.path.join(directory, "local"))
    env.pop("PYSPARK_GATEWAY_PORT", None)
    return env


def _launch(directory: str, name: str, args: list[str]) -> subprocess.Popen[bytes]:
    log = open(os.path.join(directory, f"{name}.log"), "ab")  # noqa: SIM115 (the child keeps it open)
    proc = subprocess.Popen([_spark_class(), *args], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            env=_env(directory), cwd=directory, start_new_session=True)
    log.close()
    return proc


def _alive_workers(web_url: str) -> int:
    try:
        with urllib.request.urlopen(f"{web_url}/json/", timeout=2) as r:
            return int(json.load(r).get("aliveworkers", 0))
    except (OSError, ValueError):
        return -1


def start(directory: str, workers: int = 2, cores: int = 1, memory: str = "1536m", port: int = 7077,
          web_port: int = 0, venv: str | None = None, timeout: float = 90.0) -> Cluster:
    directory = os.path.abspath(directory)
    if os.path.exists(os.path.join(directory, STATE_FILE)):
        raise StandaloneError(f"{directory} already runs a cluster: stop it first "
                              f"(python -m pipeline standalone stop --dir {directory})")
    os.makedirs(os.path.join(directory, "local"), exist_ok=True)
    python = executor_python(venv or os.path.join(directory, "executor-python"))
    web_port = web_port or free_port()
    cluster = Cluster(directory, f"spark://127.0.0.1:{port}", f"http://127.0.0.1:{web_port}", python)
    procs = [_launch(directory, "master", [f"{_DEPLOY}.master.Master", "--host", "127.0.0.1",
                                           "--port", str(port), "--webui-port", str(web_port)])]
    cluster.pids.append(procs[0].pid)
    _save(cluster)
    for i in range(workers):
        work = os.path.join(directory, f"worker-{i}")
        os.makedirs(work, exist_ok=True)
        procs.append(_launch(directory, f"worker-{i}", [
            f"{_DEPLOY}.worker.Worker", "--host", "127.0.0.1", "--cores", str(cores), "--memory", memory,
            "--work-dir", work, "--webui-port", str(free_port()), cluster.master_url]))
        cluster.pids.append(procs[-1].pid)
        _save(cluster)
    deadline = time.monotonic() + timeout
    while (alive := _alive_workers(cluster.web_url)) < workers:
        if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
            stop(directory)
            raise StandaloneError(f"{alive if alive >= 0 else 'no'} of {workers} workers registered with "
                                  f"{cluster.master_url}; see the logs in {directory} (master.log, worker-*.log)")
        time.sleep(0.5)
    return cluster


def _save(cluster: Cluster) -> None:
    with open(os.path.join(cluster.dir, STATE_FILE), "w") as f:
        json.dump(asdict(cluster), f, indent=1)


def load(directory: str) -> Cluster | None:
    try:
        with open(os.path.join(os.path.abspath(directory), STATE_FILE)) as f:
            return Cluster(**json.load(f))
    except FileNotFoundError:
        return None


def _running(pid: int) -> bool:
    """The process is alive and is one of Spark's deploy daemons (not a recycled pid)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return _DEPLOY.encode() in f.read()
    except OSError:
        return False


def stop(directory: str, timeout: float = 20.0) -> bool:
    """Stop the workers (and their executors), then the master; False when nothing ran there."""
    cluster = load(directory)
    if cluster is None:
        return False
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in reversed(cluster.pids):  # workers first
            if _running(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, sig)  # the daemon and what it started (executors)
        deadline = time.monotonic() + timeout
        while any(_running(p) for p in cluster.pids) and time.monotonic() < deadline:
            time.sleep(0.2)
        if not any(_running(p) for p in cluster.pids):
            break
    os.unlink(os.path.join(cluster.dir, STATE_FILE))
    return True
