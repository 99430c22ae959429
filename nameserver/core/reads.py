"""Local reads of a node's state: one implementation for the Raft core (nameserver/core/node.py) and for
a read replica fed by a core's apply stream (nameserver/replica).

A read runs on the local state once it has applied `min_offset` (waiting bounded), under the state
lock for that one read; a route read reuses a route computed earlier while the state's route
generation has not moved (nameserver/core/routecache.py).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from nameserver.config import NodeConfig
from nameserver.core.nowait import WouldBlock, waiting_allowed
from nameserver.core.routecache import MISS, RouteCache, RouteKey
from nameserver.errors import TooLargeError
from nameserver.state import MetadataState


class NotReady(Exception):
    pass


class OffsetNotReached(Exception):
    def __init__(self, apply_offset: int, min_offset: int) -> None:
        super().__init__(f"node is at apply offset {apply_offset}, below min_offset {min_offset}")
        self.apply_offset = apply_offset
        self.min_offset = min_offset


class LocalReads:
    """The read API the gRPC read handlers use (nameserver/api/service.py). A subclass sets `cfg`,
    `log`, `lock`, `routes`, `state` (the state the lock guards) and gives `not_ready_reason`."""

    cfg: NodeConfig
    # What applies the state (the core's ReplicatedLog, or a ReadReplica): reads use its `ready`,
    # `apply_offset` and `wait_applied(offset, timeout, alive) -> bool`.
    log: Any
    lock: Any  # a lock: held by the apply thread per entry, by a reader per read
    routes: RouteCache
    state: MetadataState
    _waiting_reads: threading.BoundedSemaphore

    def not_ready_reason(self) -> str:
        raise NotImplementedError

    def read(self, fn: Callable[[MetadataState], Any], min_offset: int, timeout: float,
             alive: Callable[[], bool] | None = None) -> tuple[Any, int]:
        """Run `fn` on the local state once ready and applied to `min_offset`; (result, apply offset).

        At most limits.max_waiting_reads reads wait at once (a waiting read holds a server thread);
        one beyond that fails TooLargeError at once. A wait ends early when `alive()` turns false."""
        if not self.log.ready:
            raise NotReady(self.not_ready_reason())
        if not waiting_allowed():  # an inline caller on an event loop: never wait (nameserver/core/nowait.py)
            if min_offset > self.log.apply_offset or not self.lock.acquire(blocking=False):
                raise WouldBlock("the state is busy or the offset is not applied yet")
        else:
            self._wait_for(min_offset, timeout, alive)
            self.lock.acquire()
        try:
            state = self.state
            return fn(state), state.kv.offset
        finally:
            self.lock.release()

    def read_route(self, key: RouteKey, compute: Callable[[MetadataState], Any], min_offset: int,
                   timeout: float, alive: Callable[[], bool] | None = None) -> tuple[Any, int]:
        """A route read: as read(), but a route computed earlier is reused while the state's route
        generation has not moved, without taking the state lock (nameserver/core/routecache.py).
        Returns (route or None, the apply offset it is valid at); the route is shared: copy it."""
        if self.log.ready:
            state = self.state
            offset = state.kv.offset  # the offset first, then the generation (see routecache.py)
            if min_offset <= offset:
                hit = self.routes.get(key, state.route_generation)
                if hit is not MISS:
                    return hit, offset

        def fill(state: MetadataState) -> Any:
            route = compute(state)
            self.routes.put(key, state.route_generation, route)
            return route

        return self.read(fill, min_offset, timeout, alive)

    def inspect(self, fn: Callable[[MetadataState], Any]) -> Any:
        """Run `fn` on the state as it is now, ready or not (status, metrics, dumps, a watch's first
        listing). Under the state lock, so `fn` sees no apply half done: keep it short."""
        with self.lock:
            return fn(self.state)

    def _wait_for(self, min_offset: int, timeout: float, alive: Callable[[], bool] | None) -> None:
        if min_offset <= self.log.apply_offset:
            return
        if not self._waiting_reads.acquire(blocking=False):
            raise TooLargeError("min_offset", f"{self.cfg.max_waiting_reads} reads are already waiting for "
                                "offsets not yet applied here (limits.max_waiting_reads); retry later")
        try:
            if not self.log.wait_applied(min_offset, timeout, alive):
                raise OffsetNotReached(self.log.apply_offset, min_offset)
        finally:
            self._waiting_reads.release()

    def catch_up(self, offset: int, timeout: float, alive: Callable[[], bool] | None = None) -> bool:
        """Wait (bounded) until this node has applied `offset`; False when it has not in time."""
        return bool(self.log.wait_applied(offset, timeout, alive))
