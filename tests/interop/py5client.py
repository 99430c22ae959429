"""PyPI's rocketmq-python-client (RocketMQ 5's gRPC client) in a virtualenv of its own, run as a subprocess.

It needs protobuf and OpenTelemetry versions of its own, so it does not go into the project's virtualenv:
`ensure()` makes tests/interop/.jars/py5client-venv (git-ignored) on first use.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from . import jars

PACKAGE = "rocketmq-python-client==5.1.2"

SCRIPT = r"""
import json, sys, threading, time
from rocketmq import ClientConfiguration, Credentials, FilterExpression, Message, Producer, SimpleConsumer
endpoints, topic, group, count = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
config = ClientConfiguration(endpoints, Credentials())
consumer = SimpleConsumer(config, group, {topic: FilterExpression()})
consumer.startup()
sent, failed, done = [], [], threading.Event()

def produce():
    # A new group's first POP starts at the queues' max offset: the sends wait until receiving has begun.
    time.sleep(5)
    producer = Producer(config, (topic,))
    producer.startup()
    for i in range(count):
        m = Message()
        m.topic = topic
        m.body = ("py5 %d" % i).encode()
        m.tag = "tag"
        m.keys = "py5-%d" % i
        try:
            sent.append(producer.send(m).message_id)
        except Exception as e:
            failed.append(repr(e))
    producer.shutdown()
    done.set()

time.sleep(3)  # the client's settings reach the proxy over its telemetry stream; a receive before that fails
threading.Thread(target=produce, daemon=True).start()
got, deadline = {}, time.time() + 120
while (not done.is_set() or len(got) < len(sent)) and time.time() < deadline:
    try:
        msgs = consumer.receive(32, 15)
    except Exception as e:
        print(json.dumps({"receive_error": repr(e)}), flush=True)
        time.sleep(1)
        continue
    for msg in msgs or []:
        got[msg.message_id] = msg.body.decode()
        consumer.ack(msg)
consumer.shutdown()
print(json.dumps({"sent": sent, "failed": failed, "received": got}), flush=True)
"""


def venv_dir() -> str:
    return os.path.join(jars.cache_root(), "py5client-venv")


def ensure() -> str:
    """The virtualenv's python, installing the client on first use."""
    d = venv_dir()
    py = os.path.join(d, "bin", "python")
    stamp = os.path.join(d, ".installed")
    if not os.path.exists(stamp):
        subprocess.run([sys.executable, "-m", "venv", d], check=True, timeout=300)
        res = subprocess.run([py, "-m", "pip", "install", "-q", PACKAGE], capture_output=True, text=True,
                             timeout=900)
        if res.returncode != 0:
            raise RuntimeError(f"pip install {PACKAGE} failed:\n{res.stdout}\n{res.stderr}")
        with open(stamp, "w") as f:
            f.write(PACKAGE + "\n")
    return py


def send_and_receive(endpoint: str, topic: str, group: str, count: int, home: str,
                     timeout: float = 240.0) -> dict:
    py = ensure()
    os.makedirs(home, exist_ok=True)
    res = subprocess.run([py, "-c", SCRIPT, endpoint, topic, group, str(count)], capture_output=True, text=True,
                         timeout=timeout, cwd=home, env=os.environ | {"HOME": home})
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith("{")]
    if res.returncode != 0 or not lines:
        raise AssertionError(f"python client exited {res.returncode}:\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}")
    return json.loads(lines[-1])
