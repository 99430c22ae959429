"""Oneway remoting requests a node sends to brokers' own addresses (the pushes: 1008, 905).

Apache RocketMQ's NameServer and controller push with invokeOneway(brokerAddr): a new connection to the
broker's listening port, where its AdminBrokerProcessor serves them. Best effort: a push that cannot be
delivered is logged and counted, never retried.
"""

from __future__ import annotations

import logging
import socket
from concurrent.futures import ThreadPoolExecutor

from nameserver.remoting import frame
from nameserver.remoting.command import Command
from nameserver.remoting.server import split_addr
from nameserver.safetext import shown

SEND_TIMEOUT_S = 3.0


def send_oneway(addr: str, cmd: Command, timeout_s: float = SEND_TIMEOUT_S) -> None:
    with socket.create_connection(split_addr(addr), timeout=timeout_s) as sock:
        sock.sendall(frame.encode(cmd))


class OnewaySender:
    """Sends off the caller's thread (a few at a time), logging each outcome to `log`."""

    def __init__(self, log: logging.Logger, name: str, workers: int = 2) -> None:
        self._log = log
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=name)
        self.sent = 0
        self.failed = 0

    def send(self, addr: str, cmd: Command, what: str) -> None:
        """Send `cmd` to `addr`; `what` says what it tells the broker, for the log."""
        self._pool.submit(self._send, addr, cmd, what)

    def _send(self, addr: str, cmd: Command, what: str) -> None:
        try:
            send_oneway(addr, cmd)
            self.sent += 1
            self._log.info("told %s of %s", shown(addr), what)
        except OSError as exc:
            self.failed += 1
            self._log.info("could not tell %s of %s: %s", shown(addr), what, exc)

    def stop(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
