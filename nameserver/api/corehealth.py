"""A node's readiness as its worker processes answer it: Admin.Status and grpc.health.v1 Health/Check and
Watch, from the node's core (a sharded node: every group core, docs/scaling.md, "Sharding"), each asked on its
private socket as the node itself (the worker's auth already let the caller make the call).

- Admin.Status: the core's status. With several groups, group 0's core's status with `groups` holding every
  group core's own; a group core that does not answer is listed not ready, naming why. The node's own `ready`
  is every group's: a write to a set of group k needs group k's core, so a node whose group k core is loading,
  restarting or not answering this worker is not ready (its `groups` row says which).
- Health/Check and Watch: the same readiness, from each core's own health (SERVING only when every group
  core's is), so a load balancer's check agrees with Admin.Status. Watch follows a Watch of each core and
  sends the node's status again whenever it changes (a group core that goes down, or whose stream breaks,
  counts NOT_SERVING until its Watch answers again; group 0's core's stream ending ends the node's, as it
  did when a worker passed the Watch on). The Controller service is group 0's core's alone (every ctrl/
  record is group 0's; a group k core lists no Controller): its health is that core's.
- A core that stopped answering: one frozen (SIGSTOP) or stalled keeps its sockets open, so a call to it
  waits instead of failing and its Watch stream stays open on its last status. The worker's replica of each
  core hears from it at least every second (its feed's keepalive, nameserver/api/follow.py), and one that
  has heard nothing for longer than its bound (nameserver/replica/follower.py, DEFAULT_MAX_SILENCE_S: 5 s,
  five missed keepalives, the same bound past which that replica refuses reads) says so (`silences`, one a
  core): Check answers NOT_SERVING without asking it, Status asks it only briefly (SILENT_ASK_S) and says it
  is not ready, naming the group and how long, every Watch of the node turns NOT_SERVING within a second,
  and all go back to what the cores say once the core is heard from again (SIGCONT).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from nameserver.api.auth import CONTROLLER_SERVICE
from nameserver.api.corelink import forwarded_metadata, own_metadata
from nameserver.config import NodeConfig, group_config
from nameserver.pb import api_pb2, api_pb2_grpc

ADMIN = api_pb2.DESCRIPTOR.services_by_name["Admin"]
HEALTH = health_pb2.DESCRIPTOR.services_by_name["Health"]
STATUS_TIMEOUT_S = 2.0  # a core's Status when the caller set no deadline: a stuck core must not hang nsctl
WATCH_RETRY_S = 0.2  # between a group core's Watch that ended and the next (which waits for the core's socket)
SILENT_ASK_S = 0.5  # how long a core silent past the bound is asked its Status (it is not waited for)
SILENCE_CHECK_S = 1.0  # how often a Watch looks at the cores' silences (and whether its caller went away)
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
SERVICE_UNKNOWN = health_pb2.HealthCheckResponse.SERVICE_UNKNOWN

# How long a core has not answered this worker, once past the bound; 0.0 while it answers (ReadReplica.unanswered).
Silence = Callable[[], float]


def _timeout(context: grpc.ServicerContext) -> float:
    left = context.time_remaining()
    return STATUS_TIMEOUT_S if left is None or left > 1e6 else max(0.1, left)


class CoreStatus:
    """Admin.Status and Health/Check and Watch of the node, answered by its worker: `cores[k]` is group k's
    core's private socket (one: a one-group node), `silences[k]` how long it has not answered this worker."""

    def __init__(self, cfg: NodeConfig, cores: Sequence[grpc.Channel], silences: Sequence[Silence]) -> None:
        assert len(cores) == len(silences) >= 1, "a silence a core"
        self.cfg = cfg
        self.admins = [api_pb2_grpc.AdminStub(channel) for channel in cores]  # admins[k]: group k's core
        self.healths = [health_pb2_grpc.HealthStub(channel) for channel in cores]
        self.silences = list(silences)
        self.metadata = own_metadata(cfg)

    def _silent(self, group: int) -> str:
        """Why group `group`'s core counts as not answering this worker, or ""."""
        silent = self.silences[group]()
        if not silent:
            return ""
        core = "this node's core" if len(self.silences) == 1 else f"group {group}'s core"
        return (f"{core} has not answered this worker for {silent:.1f} s (no message on its feed, whose keepalive "
                f"comes every second): stopped (SIGSTOP) or stalled")

    def Status(self, request: api_pb2.StatusRequest, context: grpc.ServicerContext) -> api_pb2.NodeStatus:
        timeout = _timeout(context)
        silent = [self._silent(group) for group in range(len(self.admins))]
        # a silent core is still asked, briefly: a dead one's refusal (a group core restarting) says more
        futures = [admin.Status.future(api_pb2.StatusRequest(), timeout=min(timeout, SILENT_ASK_S) if why else timeout,
                                       metadata=self.metadata)
                   for admin, why in zip(self.admins, silent, strict=True)]
        reply = self._status_of(0, futures[0], silent[0])
        if isinstance(reply, grpc.RpcError):  # as a worker passing the call on: the core's status
            context.abort(reply.code(), reply.details() or "")
        if len(futures) == 1:
            return reply
        own = api_pb2.NodeStatus()
        own.CopyFrom(reply)  # group 0's, without groups
        reply.groups.append(own)
        for group, future in enumerate(futures[1:], start=1):
            status = self._status_of(group, future, silent[group])
            if isinstance(status, grpc.RpcError):
                reply.groups.add(node_id=group_config(self.cfg, group).raft_addr, ready=False,
                                 not_ready_reason=f"group {group}'s core did not answer: {status.code().name}: "
                                                  f"{status.details()}")
            else:
                reply.groups.append(status)
        reply.ready = all(status.ready for status in reply.groups)
        return reply

    def _status_of(self, group: int, future: Any, silent: str) -> api_pb2.NodeStatus | grpc.RpcError:
        """Group `group`'s core's status, or its call's error; a core silent past the bound is not ready
        whatever it answers, and one whose answer did not come is said not ready here, naming its silence."""
        try:
            status: api_pb2.NodeStatus = future.result()
        except grpc.RpcError as err:
            if not silent or err.code() != grpc.StatusCode.DEADLINE_EXCEEDED:
                return err
            status = api_pb2.NodeStatus(node_id=group_config(self.cfg, group).raft_addr,
                                        grpc_addr=self.cfg.grpc_addr if group == 0 else "")
        if silent:
            status.ready, status.not_ready_reason = False, silent
        return status

    def _asked(self, service: str) -> int:
        """How many group cores (0 to n - 1) a health call of `service` asks: the Controller service is group
        0's core's alone (a group k core does not serve it)."""
        return 1 if service == CONTROLLER_SERVICE else len(self.healths)

    def Check(self, request: health_pb2.HealthCheckRequest, context: grpc.ServicerContext
              ) -> health_pb2.HealthCheckResponse:
        asked = self._asked(request.service)
        if any(self.silences[group]() for group in range(asked)):  # not asked: its answer would wait
            return health_pb2.HealthCheckResponse(status=NOT_SERVING)
        timeout = _timeout(context)
        futures = [health.Check.future(request, timeout=timeout, metadata=self.metadata)
                   for health in self.healths[:asked]]
        try:
            reply: health_pb2.HealthCheckResponse = futures[0].result()
        except grpc.RpcError as err:  # as a worker passing the call on (NOT_FOUND: no such service)
            context.abort(err.code(), err.details() or "")
        for future in futures[1:]:
            try:
                serving = future.result().status == SERVING
            except grpc.RpcError:
                serving = False
            if not serving:
                reply.status = NOT_SERVING
        return reply

    def Watch(self, request: health_pb2.HealthCheckRequest, context: grpc.ServicerContext
              ) -> Iterator[health_pb2.HealthCheckResponse]:
        """The node's health as it changes: a Watch of each core asked (carrying the caller, as a worker
        passing the Watch on did, so each core bounds the caller's streams), combined as Check combines
        them, with the cores' silences. The first answer waits for every core's first (at most
        STATUS_TIMEOUT_S: one not answered by then counts NOT_SERVING; group 0's core silent: NOT_SERVING at
        once); group 0's core's stream ending ends this one with its status."""
        asked = self._asked(request.service)
        watching = _Watching(self.healths[:asked], self.silences[:asked], request, forwarded_metadata(context))
        context.add_callback(watching.close)
        watching.start()
        try:
            yield from watching.changes(context)
        finally:
            watching.close()
        if watching.ended is not None:
            code, details = watching.ended
            context.abort(code, details)

    def handlers(self) -> dict[str, grpc.RpcMethodHandler]:
        return {f"/{ADMIN.full_name}/Status": grpc.unary_unary_rpc_method_handler(
            self.Status, request_deserializer=api_pb2.StatusRequest.FromString,
            response_serializer=api_pb2.NodeStatus.SerializeToString),
            f"/{HEALTH.full_name}/Check": grpc.unary_unary_rpc_method_handler(
            self.Check, request_deserializer=health_pb2.HealthCheckRequest.FromString,
            response_serializer=health_pb2.HealthCheckResponse.SerializeToString),
            f"/{HEALTH.full_name}/Watch": grpc.unary_stream_rpc_method_handler(
            self.Watch, request_deserializer=health_pb2.HealthCheckRequest.FromString,
            response_serializer=health_pb2.HealthCheckResponse.SerializeToString)}


class _Watching:
    """One Health/Watch of the node: a thread a core following that core's Watch (again after its stream
    ends, waiting for the core to accept it), and the combined status, sent when it changes."""

    def __init__(self, healths: Sequence[health_pb2_grpc.HealthStub], silences: Sequence[Silence],
                 request: health_pb2.HealthCheckRequest, metadata: Sequence[tuple[str, Any]]) -> None:
        self.healths = list(healths)
        self.silences = list(silences)
        self.request = request
        self.metadata = tuple(metadata)
        self.cond = threading.Condition()
        self.statuses: list[int | None] = [None] * len(self.healths)  # [k]: group k's core's; None: not yet
        self.calls: list[Any] = [None] * len(self.healths)  # [k]: group k's core's Watch, while it runs
        self.closed = False
        self.group0_done = False  # group 0's core's stream ended: so does this Watch
        self.ended: tuple[grpc.StatusCode, str] | None = None  # how it ended, when with an error

    def start(self) -> None:
        for group in range(len(self.healths)):
            threading.Thread(target=self._follow, args=(group,), name=f"health-watch-g{group}", daemon=True).start()

    def close(self) -> None:
        with self.cond:
            self.closed = True
            calls = [call for call in self.calls if call is not None]
            self.cond.notify_all()
        for call in calls:
            call.cancel()

    def _follow(self, group: int) -> None:
        first = True
        while True:
            # the first call fails at once when the core does not accept (counted NOT_SERVING); later ones wait
            # for its socket (a restarted core's), which the worker's channel reconnects to within a second
            call = self.healths[group].Watch(self.request, metadata=self.metadata, wait_for_ready=not first)
            with self.cond:
                if self.closed:
                    call.cancel()
                    return
                self.calls[group] = call
            failure: tuple[grpc.StatusCode, str] | None = None
            try:
                for reply in call:
                    with self.cond:
                        self.statuses[group] = reply.status
                        self.cond.notify_all()
            except grpc.RpcError as err:
                failure = (err.code(), err.details() or "")
            with self.cond:
                self.calls[group] = None
                if self.closed:
                    return
                if group == 0:  # the node's own core: this Watch ends as its stream did
                    self.group0_done, self.ended = True, failure
                    self.cond.notify_all()
                    return
                self.statuses[group] = NOT_SERVING
                self.cond.notify_all()
                self.cond.wait(WATCH_RETRY_S)  # close() wakes it
                if self.closed:
                    return
            first = False

    def _combined(self, first_due: bool) -> int | None:
        """The node's status now (under the lock); None until group 0's core's first answer (or its silence)
        and, before `first_due`, every other core's."""
        silent = [bool(silence()) for silence in self.silences]
        group0 = self.statuses[0]
        if group0 is None and not silent[0]:
            return None
        if not first_due and any(status is None and not quiet for status, quiet in zip(self.statuses, silent,
                                                                                        strict=True)):
            return None
        if group0 == SERVICE_UNKNOWN:
            return SERVICE_UNKNOWN
        return SERVING if all(status == SERVING and not quiet for status, quiet in zip(self.statuses, silent,
                                                                                         strict=True)) else NOT_SERVING

    def changes(self, context: grpc.ServicerContext) -> Iterator[health_pb2.HealthCheckResponse]:
        due = time.monotonic() + STATUS_TIMEOUT_S
        sent: int | None = None
        while True:
            with self.cond:
                while True:
                    if self.closed or self.group0_done or not context.is_active():
                        return
                    now = time.monotonic()
                    status = self._combined(now >= due)
                    if status is not None and status != sent:
                        break
                    # woken by any core's change; timed for the first answer's bound, a core's silence and
                    # a caller gone unseen
                    self.cond.wait(min(SILENCE_CHECK_S, due - now) if now < due else SILENCE_CHECK_S)
            sent = status
            yield health_pb2.HealthCheckResponse(status=status)


__all__ = ["CoreStatus", "Silence"]
