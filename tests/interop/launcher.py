"""Real Apache RocketMQ processes for the interop tests: brokers, the stock NameServer, mqadmin, a Java client.

    rmq = RocketMQ("4.9.7", "/tmp/x")          # jars fetched on demand (tests/interop/jars.py)
    ns = rmq.namesrv()                          # the stock NameServer (NamesrvStartup), on a free port
    a = rmq.broker("broker-a", namesrv="127.0.0.1:9876;127.0.0.1:9877")
    rmq.mqadmin("clusterList", namesrv=...)     # CompletedProcess, output captured
    c = rmq.client("consume", ns_addr, topic, group, "c1")   # tests/interop/java/InteropClient.java
    rmq.stop_all()                              # SIGTERM, then SIGKILL after a grace period

Every process gets a small heap, its own user.home (logs, namesrv kvConfig, client state) and store dir
under `root`, and free 127.0.0.1 ports. rocketmq.home.dir is tests/interop/home (4.9.x reads its logback
files from home/conf; -Dinterop.log names the log file).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from nameserver.localports import free_ports

from . import jars

HERE = os.path.dirname(os.path.abspath(__file__))
HOME = os.path.join(HERE, "home")
JAVA_SRC = os.path.join(HERE, "java", "InteropClient.java")

# Java 17 flags: RocketMQ's mapped files and netty reach into java.nio/sun.nio.ch; a small, fast-starting JVM.
JAVA_OPENS = ["--add-opens", "java.base/java.nio=ALL-UNNAMED", "--add-opens", "java.base/sun.nio.ch=ALL-UNNAMED",
              "--add-opens", "java.base/java.lang=ALL-UNNAMED", "--add-opens", "java.base/java.util=ALL-UNNAMED",
              "--add-exports", "java.base/sun.nio.ch=ALL-UNNAMED",
              # MappedFile.clean() calls jdk.internal.ref.Cleaner: without this a broker's shutdown hook dies
              # in the store's shutdown, before it unregisters from the nameservers
              "--add-opens", "java.base/jdk.internal.ref=ALL-UNNAMED",
              "--add-exports", "java.base/jdk.internal.ref=ALL-UNNAMED"]
# mqadmin's own client giving up (no answer in its budget, or no connection in its connect timeout): on a
# loaded machine that is contention, so RocketMQ.mqadmin runs the command again.
CLIENT_TIMEOUTS = ("RemotingTimeoutException", "RemotingConnectException")
MQADMIN_ATTEMPTS = 5  # 3 were not enough at load 65 on 2 cores (every one timed out before its first connect)
JAVA_SMALL = ["-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Xss512k", "-XX:-UsePerfData",
              "-Djava.net.preferIPv4Stack=true"]

_compile_lock = threading.Lock()


def _port_free(port: int) -> bool:
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", port))
        return True
    except OSError:
        return False
    finally:
        s.close()


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


_handed_out: set[int] = set()  # ports given to brokers of this process: free now, bound only once the JVM is up
_ports_lock = threading.Lock()


def broker_ports() -> tuple[int, int]:
    """(listenPort, haListenPort): a broker also listens on listenPort - 2 (its VIP channel), so all three
    must be free, and none handed to another broker that may not have bound it yet."""
    with _ports_lock:
        for _ in range(200):
            (p,) = free_ports(1)
            trio = {p - 2, p, p + 1}
            if p > 2000 and not trio & _handed_out and _port_free(p - 2) and _port_free(p + 1):
                _handed_out.update(trio)
                return p, p + 1
    raise RuntimeError("no free broker ports")


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


def _properties_text(value: str) -> str:
    """A value for a .properties file: Java reads those as ISO-8859-1, so anything past ASCII is a \\u escape."""
    return "".join(ch if ord(ch) < 128 else f"\\u{ord(ch):04x}" for ch in value)


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
                if left <= 0 or (not self.alive and i >= len(self.lines) and not self._reader.is_alive()):
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


@dataclass
class Broker:
    proc: JavaProc
    cluster: str
    name: str
    broker_id: int
    addr: str
    ha_addr: str
    conf_path: str
    store: str

    @property
    def alive(self) -> bool:
        return self.proc.alive


class RocketMQ:
    """Starts, tracks and stops the real RocketMQ processes of one version under `root`."""

    def __init__(self, version: str, root: str) -> None:
        self.version = version
        self.root = root
        os.makedirs(root, exist_ok=True)
        self.cp = jars.classpath(version)
        self.procs: list[JavaProc] = []
        self._n = 0

    @property
    def is5(self) -> bool:
        return jars.is_5x(self.version)

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

    # ---- the stock controller (5.x, RIP-44) -----------------------------------------------------

    def controller(self, name: str = "controller") -> tuple[JavaProc, str]:
        """Apache RocketMQ's standalone controller on a one-node DLedger group; (process, "127.0.0.1:port").
        It serves the controller's requests on its DLedger peer port (the brokers' controllerAddr)."""
        port, dledger = free_ports(2)
        home = self._dir(f"home-{name}")
        conf = os.path.join(home, "controller.conf")
        settings = {"listenPort": str(port), "controllerType": "DLedger", "controllerDLegerGroup": "g1",
                    "controllerDLegerPeers": f"n0-127.0.0.1:{dledger}", "controllerDLegerSelfId": "n0",
                    "controllerStorePath": os.path.join(home, "store"), "scanNotActiveBrokerInterval": "500",
                    "notifyBrokerRoleChanged": "true", "enableElectUncleanMaster": "false"}
        with open(conf, "w") as f:
            f.write("".join(f"{k}={v}\n" for k, v in settings.items()))
        jp = self.start_java("org.apache.rocketmq.controller.ControllerStartup", ["-c", conf], name, heap="128m")
        addr = f"127.0.0.1:{dledger}"
        wait_port(addr, 90, jp)
        return jp, addr

    # ---- brokers -------------------------------------------------------------------------------

    def broker(self, name: str, namesrv: str, broker_id: int = 0, cluster: str = "InteropCluster",
               extra: dict[str, str] | None = None, wait: bool = True,
               heap: str = "256m", props: dict[str, str] | None = None, instance: str = "") -> Broker:
        """Start a broker: brokerId 0 is the master, >= 1 a slave (which finds its master through the nameserver).
        In controller mode the controller assigns ids: `instance` then tells the set's brokers apart."""
        port, ha = broker_ports()
        proc_name = f"{name}-{instance or broker_id}"
        store = self._dir(f"store-{proc_name}")
        conf = {
            "brokerClusterName": cluster, "brokerName": name, "brokerId": str(broker_id),
            "brokerIP1": "127.0.0.1", "brokerIP2": "127.0.0.1", "listenPort": str(port), "haListenPort": str(ha),
            "namesrvAddr": namesrv, "storePathRootDir": store,
            "storePathCommitLog": os.path.join(store, "commitlog"),
            "brokerRole": "SLAVE" if broker_id else "ASYNC_MASTER", "flushDiskType": "ASYNC_FLUSH",
            # small files: 16 MiB commit log, 300 KB consume queues (20 bytes a unit), small index
            "mapedFileSizeCommitLog": str(16 << 20), "mappedFileSizeCommitLog": str(16 << 20),
            "mapedFileSizeConsumeQueue": str(300000), "mappedFileSizeConsumeQueue": str(300000),
            "mappedFileSizeConsumeQueueExt": str(1 << 20), "maxHashSlotNum": "50000", "maxIndexNum": "200000",
            "transientStorePoolEnable": "false", "warmMapedFileEnable": "false",
            "autoCreateTopicEnable": "true", "autoCreateSubscriptionGroup": "true",
            "diskMaxUsedSpaceRatio": "98", "traceTopicEnable": "false",
            "sendMessageThreadPoolNums": "2", "pullMessageThreadPoolNums": "4",
            "registerNameServerPeriod": "30000",
            # The transaction check creates RMQ_SYS_TRANS_HALF_TOPIC on its own clock (4.9.7: at its first
            # run, a minute after start); pushed out, so topic lists do not depend on how long a test ran.
            "transactionCheckInterval": str(3_600_000),
        }
        if self.is5:
            # (timerWheelEnable stays on: with it off, the broker's DELETE_TOPIC handler throws an NPE)
            conf |= {"enableControllerMode": "false", "useServerSideResetOffset": "true"}
        conf |= extra or {}
        conf_path = os.path.join(self._dir(f"home-{proc_name}"), "broker.conf")
        with open(conf_path, "w") as f:
            f.write("\n".join(f"{k}={_properties_text(v)}" for k, v in conf.items()) + "\n")
        jp = self.start_java("org.apache.rocketmq.broker.BrokerStartup", ["-c", conf_path], proc_name, heap=heap,
                             props=props)
        b = Broker(jp, cluster, name, broker_id, f"127.0.0.1:{port}", f"127.0.0.1:{ha}", conf_path, store)
        if wait:
            jp.wait_line(lambda ln: "boot success" in ln, timeout=120)
        return b

    # ---- mqadmin -------------------------------------------------------------------------------

    def mqadmin(self, *args: str, namesrv: str, timeout: float = 90.0, props: dict[str, str] | None = None
                ) -> subprocess.CompletedProcess:
        """Run org.apache.rocketmq.tools.command.MQAdminStartup with `-n namesrv`; output captured (text).
        A run that failed on its own client's timeout is run again, up to MQADMIN_ATTEMPTS in all: mqadmin's
        budget is fixed (5 s per call, the connect's time taken out of it) and no option raises it; on a loaded
        machine a fresh JVM's first connect alone can take 3 s of it (seen: "timeout, 2029(ms)")."""
        for attempt in range(1, MQADMIN_ATTEMPTS + 1):
            self._n += 1
            cmd = self.java_cmd("org.apache.rocketmq.tools.command.MQAdminStartup", [*args, "-n", namesrv],
                                f"mqadmin{self._n}", heap="96m", props=props)
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                                 cwd=self._dir(f"home-mqadmin{self._n}"))
            out = res.stdout + res.stderr
            if attempt == MQADMIN_ATTEMPTS or not any(t in out for t in CLIENT_TIMEOUTS):
                return res
            print(f"mqadmin {' '.join(args)}: its client timed out (attempt {attempt}), running it again")
        raise AssertionError("unreachable")

    # ---- the Java producer / consumer ----------------------------------------------------------

    def client_classes(self) -> str:
        """Compile tests/interop/java/InteropClient.java against this version's jars (once per source change)."""
        out = os.path.join(jars.jars_dir(self.version) + "-classes")
        stamp = os.path.join(out, ".src-mtime")
        mtime = str(os.path.getmtime(JAVA_SRC))
        with _compile_lock:
            if _read(stamp) != mtime:
                os.makedirs(out, exist_ok=True)
                res = subprocess.run(["javac", "-nowarn", "-d", out, "-cp", self.cp, JAVA_SRC],
                                     capture_output=True, text=True, timeout=300)
                if res.returncode != 0:
                    raise RuntimeError(f"javac failed:\n{res.stdout}\n{res.stderr}")
                with open(stamp, "w") as f:
                    f.write(mtime)
        return out

    def client(self, mode: str, *args: str, name: str | None = None, props: dict[str, str] | None = None
               ) -> JavaProc:
        cp = self.client_classes() + os.pathsep + self.cp
        base = {"rocketmq.client.rebalance.waitInterval": "2000"}
        jp = self.start_java("InteropClient", [mode, *args], name, heap="128m", cp=cp, props=base | (props or {}))
        return jp

    # ---- the 5.x proxy ---------------------------------------------------------------------------

    def proxy(self, namesrv: str, cluster: str = "InteropCluster", name: str = "proxy") -> tuple[JavaProc, str]:
        """RocketMQ 5's proxy in cluster mode (routes from `namesrv`); returns (process, gRPC "host:port")."""
        grpc_port, remoting_port = free_ports(2)
        conf = os.path.join(self._dir(f"home-{name}"), "rmq-proxy.json")
        with open(conf, "w") as f:
            f.write(json.dumps({"rocketMQClusterName": cluster, "namesrvAddr": namesrv, "proxyMode": "cluster",
                                "grpcServerPort": grpc_port, "remotingListenPort": remoting_port,
                                "enableTopicMessageTypeCheck": False}))
        jp = self.start_java("org.apache.rocketmq.proxy.ProxyStartup", ["-pc", conf, "-pm", "cluster"], name,
                             heap="256m")
        addr = f"127.0.0.1:{grpc_port}"
        wait_port(addr, 120, jp)
        return jp, addr
