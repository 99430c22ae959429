"""`make run`: start a local 3- (or 5-) node cluster on 127.0.0.1 in the foreground.

Each node is a real `nameserver serve` process with its config in deploy/local-N/ and its data
under data/local-N/, so a second run recovers the first one's state. Ctrl-C stops them all.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time

import grpc

from nameserver import config
from nameserver.pb import api_pb2, api_pb2_grpc

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _pump(name: str, stream) -> None:
    for line in iter(stream.readline, b""):
        sys.stdout.write(f"[{name}] {line.decode(errors='replace')}")
        sys.stdout.flush()


def _status(addr: str) -> api_pb2.NodeStatus | None:
    try:
        with grpc.insecure_channel(addr) as ch:
            return api_pb2_grpc.AdminStub(ch).Status(api_pb2.StatusRequest(), timeout=1)
    except grpc.RpcError:
        return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--nodes", type=int, choices=(3, 5), default=3)
    args = p.parse_args(argv)
    conf_dir = os.path.join(ROOT, "deploy", f"local-{args.nodes}")
    procs: list[tuple[str, subprocess.Popen]] = []
    cfgs = [config.load(os.path.join(conf_dir, f"n{i}.toml")) for i in range(1, args.nodes + 1)]
    grpc_addrs = [c.grpc_addr for c in cfgs]
    remoting = ";".join(c.remoting_addr for c in cfgs if c.remoting_addr)
    controllers = ";".join(c.controller_addr for c in cfgs if c.controller_addr)
    for i in range(1, args.nodes + 1):
        cmd = [sys.executable, "-m", "nameserver.cli.serve", "serve", "--config",
               os.path.join(conf_dir, f"n{i}.toml")]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=ROOT)
        procs.append((f"n{i}", proc))
        threading.Thread(target=_pump, args=(f"n{i}", proc.stdout), daemon=True).start()

    def stop() -> None:
        for _name, proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for _name, proc in procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()

    def terminate(*_: object) -> None:
        stop()
        sys.exit(0)

    signal.signal(signal.SIGTERM, terminate)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            st = [_status(a) for a in grpc_addrs]
            if all(s is not None and s.ready for s in st) and any(s is not None and s.role == api_pb2.ROLE_LEADER
                                                                  for s in st):
                break
            if any(proc.poll() is not None for _, proc in procs):
                print("a node exited during start-up; see its log above", file=sys.stderr)
                stop()
                return 1
            time.sleep(0.3)
        endpoints = ",".join(grpc_addrs)
        print(f"""
=== local {args.nodes}-node cluster is up: gRPC endpoints {endpoints}
    RocketMQ: namesrvAddr={remoting}  (5.x controller mode: controllerAddr={controllers})
    data under data/local-{args.nodes}/ (a second run recovers it). Try, in another shell:
      .venv/bin/nsctl status
      .venv/bin/nsctl broker register --cluster DefaultCluster --name broker-a --addr 10.0.0.1:10911 \\
          --topic-prefix TopicTest --topic-count 100
      .venv/bin/nsctl route TopicTest7
      .venv/bin/nsctl clusters
    Ctrl-C stops the cluster.
""", flush=True)
        reported: set[str] = set()
        while any(proc.poll() is None for _, proc in procs):
            for name, proc in procs:
                if proc.poll() is not None and name not in reported:
                    # A killed node is part of the tour: the rest keep serving (a majority still can).
                    reported.add(name)
                    conf = os.path.join(conf_dir, f"{name}.toml")
                    print(f"=== {name} exited (code {proc.returncode}); the others keep running. Restart it "
                          f"with: .venv/bin/nameserver serve --config {os.path.relpath(conf, ROOT)}", flush=True)
            time.sleep(0.5)
        print("every node exited", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\nstopping the cluster...", flush=True)
        return 0
    finally:
        stop()


if __name__ == "__main__":
    sys.exit(main())
