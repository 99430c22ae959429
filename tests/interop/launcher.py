"""Real Apache RocketMQ processes for the interop tests: brokers, the stock NameServer, mqadmin, a Java client.

    rmq = RocketMQ("4.9.7", "/tmp/x")          # jars fetched on demand (tests/interop/jars.py)
    ns = rmq.namesrv()                          # the stock NameServer (NamesrvStartup), on a free port
    a = rmq.broker("broker-a", namesrv="127.0.0.1:9876;127.0.0.1:9877")
    rmq.mqadmin("clusterList", namesrv=...)     # CompletedProcess, output captured
    c = rmq.client("consume", ns_addr, topic, group, "c1")   # tests/interop/java/InteropClient.java
    rmq.stop_all()                              # SIGTERM, then SIGKILL after a grace period

Every process gets a small heap, its own user.home (logs, namesrv kvConfig, client state) and store dir
under `root`, and free 127.0.0.1 ports. rocketmq.home.dir is tests/interop/home (4.9.x reads its logback
files from home/conf; -Dinterop.log names the log file). The JVM plumbing and the stock NameServer are
bench/rocketmq.py's (JavaProcesses, JavaProc), which the benchmarks share.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import threading
from dataclasses import dataclass

from bench.rocketmq import JavaProc, JavaProcesses, jars_dir, wait_port
from nameserver.localports import free_ports

HERE = os.path.dirname(os.path.abspath(__file__))
JAVA_SRC = os.path.join(HERE, "java", "InteropClient.java")

# mqadmin's own client giving up (no answer in its budget, or no connection in its connect timeout): on a
# loaded machine that is contention, so RocketMQ.mqadmin runs the command again.
CLIENT_TIMEOUTS = ("RemotingTimeoutException", "RemotingConnectException")
MQADMIN_ATTEMPTS = 5  # 3 were not enough at load 65 on 2 cores (every one timed out before its first connect)
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


def _properties_text(value: str) -> str:
    """A value for a .properties file: Java reads those as ISO-8859-1, so anything past ASCII is a \\u escape."""
    return "".join(ch if ord(ch) < 128 else f"\\u{ord(ch):04x}" for ch in value)


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


class RocketMQ(JavaProcesses):
    """Starts, tracks and stops the real RocketMQ processes of one version under `root`."""

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
        out = os.path.join(jars_dir(self.version) + "-classes")
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
