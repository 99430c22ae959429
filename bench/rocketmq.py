"""Apache RocketMQ for the benchmarks and the interop tests: its jars, fetched by Maven and cached per version,
and its JVMs (the stock NameServer), started under a root and stopped. tests/interop/launcher.py builds its
brokers, tools and clients on this; bench/cores.py runs the stock NameServer beside ours.

The jars' Maven project, the cache and the RocketMQ home live under tests/interop/ (data, not code: `make
interop-setup` fills the cache, `python -m tests.interop.jars`). The cache is tests/interop/.jars/<version>/
(git-ignored; RMQ_JARS_DIR moves it). A version whose folder holds the `.complete` stamp is not fetched again.
Maven runs non-interactively (`mvn -B -q`), so a fresh machine with Maven Central reachable fetches everything.

The two lines (checked on Maven Central: 4.9.8's broker and 5.5.1's namesrv/client/tools are not served,
so these are the newest versions whose broker, namesrv, client, tools and proxy all resolve):
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from nameserver.localports import free_ports

INTEROP = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "interop")
POM = os.path.join(INTEROP, "pom.xml")
HOME = os.path.join(INTEROP, "home")  # rocketmq.home.dir: 4.9.x reads its logback files from home/conf

LINE_4 = "4.9.7"  # newest 4.9.x whose artifacts resolve
LINE_5 = "5.5.0"  # newest 5.x whose artifacts resolve; runs on Java 17
LINES = (LINE_4, LINE_5)

STAMP = ".complete"


def cache_root() -> str:
    return os.environ.get("RMQ_JARS_DIR") or os.path.join(INTEROP, ".jars")


def jars_dir(version: str) -> str:
    return os.path.join(cache_root(), version)


def is_5x(version: str) -> bool:
    return int(version.split(".")[0]) >= 5


def ensure(version: str, quiet: bool = True) -> str:
    """Fetch `version`'s jars unless already cached; return the folder. Raises RuntimeError on failure."""
    out = jars_dir(version)
    if os.path.exists(os.path.join(out, STAMP)):
        return out
    mvn = shutil.which("mvn")
    if mvn is None:
        raise RuntimeError("mvn not found: install Maven (Debian: apt-get install maven)")
    tmp = out + ".part"
    shutil.rmtree(tmp, ignore_errors=True)
    cmd = [mvn, "-B", "-f", POM, f"-Drocketmq.version={version}", f"-Djars.dir={tmp}"]
    if quiet:
        cmd.append("-q")
    if is_5x(version):
        cmd.append("-Pproxy")
    cmd.append("dependency:copy-dependencies")
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if res.returncode != 0:
        raise RuntimeError(f"fetching RocketMQ {version} failed ({' '.join(cmd)}):\n"
                           f"{res.stdout[-4000:]}\n{res.stderr[-2000:]}")
    if not glob.glob(os.path.join(tmp, f"rocketmq-broker-{version}.jar")):
        raise RuntimeError(f"fetching RocketMQ {version}: no rocketmq-broker jar in {tmp}")
    with open(os.path.join(tmp, STAMP), "w") as f:
        f.write(version + "\n")
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
    return out


def classpath(version: str) -> str:
    """The Java classpath of every cached jar of `version` (fetching them first if needed)."""
    d = ensure(version)
    return os.path.join(d, "*")



# Java 17 flags: RocketMQ's mapped files and netty reach into java.nio/sun.nio.ch; a small, fast-starting JVM.
JAVA_OPENS = ["--add-opens", "java.base/java.nio=ALL-UNNAMED", "--add-opens", "java.base/sun.nio.ch=ALL-UNNAMED",
              "--add-opens", "java.base/java.lang=ALL-UNNAMED", "--add-opens", "java.base/java.util=ALL-UNNAMED",
              "--add-exports", "java.base/sun.nio.ch=ALL-UNNAMED",
              # MappedFile.clean() calls jdk.internal.ref.Cleaner: without this a broker's shutdown hook dies
              # in the store's shutdown, before it unregisters from the nameservers
              "--add-opens", "java.base/jdk.internal.ref=ALL-UNNAMED",
              "--add-exports", "java.base/jdk.internal.ref=ALL-UNNAMED"]
JAVA_SMALL = ["-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Xss512k", "-XX:-UsePerfData",
              "-Djava.net.preferIPv4Stack=true"]


def wait_port(addr: str, timeout: float = 60.0, proc: JavaProc | None = None) -> None:
    host, port = addr.rsplit(":", 1)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and not proc.alive:
            raise RuntimeError(f"{proc.name} exited ({proc.proc.returncode}) before listening on {addr}:\n"
                               f"{proc.tail()}")
        try:
            with socket.create_connection((host, int(port)), timeout=0.5):
                return
        except OSError:
            time.sleep(0.2)
    raise TimeoutError(f"{addr} not listening after {timeout}s" + (f"\n{proc.tail()}" if proc else ""))


@dataclass
class JavaProc:
    """One JVM; stdout and stderr go to `out_path` and are also kept as lines (`lines`) for the tests."""
    name: str
    cmd: list[str]
    out_path: str
    proc: subprocess.Popen
    lines: list[str] = field(default_factory=list)
    _reader: threading.Thread | None = None
    _cond: threading.Condition = field(default_factory=threading.Condition)

    def __post_init__(self) -> None:
        self._reader = threading.Thread(target=self._pump, name=f"out-{self.name}", daemon=True)
        self._reader.start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        with open(self.out_path, "a", errors="replace") as log:
            for raw in self.proc.stdout:
                line = raw.decode(errors="replace").rstrip("\n")
                log.write(line + "\n")
                log.flush()
                with self._cond:
                    self.lines.append(line)
                    self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def wait_line(self, pred: Callable[[str], bool], timeout: float = 60.0, start: int = 0) -> str:
        """The first output line from index `start` on that satisfies pred."""
        deadline = time.monotonic() + timeout
        i = start
        with self._cond:
            while True:
                while i < len(self.lines):
                    if pred(self.lines[i]):
                        return self.lines[i]
                    i += 1
                left = deadline - time.monotonic()
                pumping = self._reader is not None and self._reader.is_alive()
                if left <= 0 or (not self.alive and i >= len(self.lines) and not pumping):
                    raise TimeoutError(f"{self.name}: no matching line after {timeout}s\n{self.tail()}")
                self._cond.wait(min(left, 0.5))

    def snapshot(self) -> list[str]:
        with self._cond:
            return list(self.lines)

    def tail(self, n: int = 40) -> str:
        return "\n".join(self.snapshot()[-n:])

    def signal(self, sig: int) -> None:
        if self.alive:
            self.proc.send_signal(sig)

    def kill(self) -> None:
        """SIGKILL and reap."""
        self.signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM (RocketMQ's shutdown hooks unregister brokers and clients), SIGKILL after `grace`."""
        if self.alive:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)
        if self._reader is not None:
            self._reader.join(timeout=5)


class JavaProcesses:
    """Starts, tracks and stops JVMs of one RocketMQ version under `root` (its jars on the classpath), among
    them the stock NameServer; tests/interop/launcher.py's RocketMQ adds brokers, clients and tools."""

    def __init__(self, version: str, root: str) -> None:
        self.version = version
        self.root = root
        os.makedirs(root, exist_ok=True)
        self.cp = classpath(version)
        self.procs: list[JavaProc] = []
        self._n = 0

    @property
    def is5(self) -> bool:
        return is_5x(self.version)

    # ---- plumbing ------------------------------------------------------------------------------

    def _dir(self, name: str) -> str:
        d = os.path.join(self.root, name)
        os.makedirs(d, exist_ok=True)
        return d

    def java_cmd(self, main: str, args: list[str], name: str, heap: str = "128m", cp: str | None = None,
                 props: dict[str, str] | None = None) -> list[str]:
        home = self._dir(f"home-{name}")
        sysprops = {"rocketmq.home.dir": HOME, "user.home": home, "interop.log": os.path.join(home, f"{name}.log"),
                    "rocketmq.client.logRoot": os.path.join(home, "logs"),
                    # 5.x: the client's own logback, at WARN, into home
                    "rocketmq.client.logLevel": "WARN",
                    } | (props or {})
        return (["java", f"-Xmx{heap}", f"-Xms{heap}", "-XX:MaxDirectMemorySize=128m", *JAVA_SMALL, *JAVA_OPENS]
                + [f"-D{k}={v}" for k, v in sysprops.items()]
                + ["-cp", cp or self.cp, main, *args])

    def start_java(self, main: str, args: list[str], name: str | None = None, heap: str = "128m",
                   cp: str | None = None, props: dict[str, str] | None = None) -> JavaProc:
        self._n += 1
        name = name or f"java{self._n}"
        cmd = self.java_cmd(main, args, name, heap, cp, props)
        out = os.path.join(self.root, f"{name}.out")
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=self._dir(f"home-{name}"),
                             start_new_session=True)
        jp = JavaProc(name, cmd, out, p)
        self.procs.append(jp)
        return jp

    def stop_all(self, grace: float = 15.0) -> None:
        """SIGTERM to every process (RocketMQ's shutdown hooks run), SIGKILL to those still up after `grace`."""
        for p in self.procs:
            p.signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        for p in self.procs:
            try:
                p.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.proc.kill()
                p.proc.wait(timeout=30)
        for p in self.procs:
            if p._reader is not None:
                p._reader.join(timeout=5)

    # ---- the stock NameServer ------------------------------------------------------------------

    def namesrv(self, name: str = "namesrv", port: int | None = None, extra: dict[str, str] | None = None
                ) -> tuple[JavaProc, str]:
        """Start Apache RocketMQ's NameServer; returns (process, "127.0.0.1:port") once it listens."""
        port = port or free_ports(1)[0]
        conf = os.path.join(self._dir(f"home-{name}"), "namesrv.conf")
        with open(conf, "w") as f:
            f.write("\n".join(f"{k}={v}" for k, v in ({"listenPort": str(port)} | (extra or {})).items()) + "\n")
        jp = self.start_java("org.apache.rocketmq.namesrv.NamesrvStartup", ["-c", conf], name, heap="128m")
        addr = f"127.0.0.1:{port}"
        wait_port(addr, 90, jp)
        return jp, addr


__all__ = ["HOME", "STAMP", "JAVA_OPENS", "JAVA_SMALL", "LINE_4", "LINE_5", "LINES", "JavaProc", "JavaProcesses",
           "cache_root", "classpath", "ensure", "is_5x", "jars_dir", "wait_port"]
