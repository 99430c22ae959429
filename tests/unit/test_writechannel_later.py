"""A worker's write on the core's write channel waits for its commit with no thread held (nameserver/api/
writechannel.py, NameServerService.write, NameServerNode.write_later, GroupCommitter.propose_later): the servicer
runs to the proposal and returns a Later; the apply thread makes the reply and sends the answer, stamped with the
apply offset as of then (read-your-writes on the worker). Every per-call check still runs before the proposal
(validation naming the field, nothing in the log on bad input; exactly-once sessions), a later failure gets the
status a raise gets (the error table, rpc.abort_for), a write that raced is translated again where waiting is
allowed, and a write nobody answered by its time ends "outcome unknown", once. A real one-node core in this
process (tests/unit/conftest.py), the channel on a real Unix socket."""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from nameserver import headers
from nameserver.api import corelink, grpcserver, writechannel
from nameserver.api.grpcwrap import wrap_handler
from nameserver.api.later import Later
from nameserver.api.rpc import DeadlinePassed, rpc
from nameserver.api.service import NameServerService, register_reply
from nameserver.core.node import NameServerNode, WriteResult
from nameserver.errors import TooLargeError
from nameserver.pb import api_pb2
from nameserver.state import translate
from nameserver.state.translate import CasFailed
from raftlog.proposer import NotLeader, ProposalError
from tests.cluster import register_request

REGISTER = writechannel.method_path("RegisterBroker")
CALLER = ((headers.WORKER_CALLER, json.dumps({"peer": "ipv4:127.0.0.1:1", "auth": {}})),)


class Where(grpc.ServerInterceptor):
    """Outermost: the thread each call's interceptors and servicer ran on."""

    def __init__(self) -> None:
        self.threads: list[str] = []

    def intercept_service(self, continuation: Any, details: grpc.HandlerCallDetails) -> Any:
        def wrap(behavior: Any, kind: str) -> Any:
            def noted(request: Any, context: Any) -> Any:
                self.threads.append(threading.current_thread().name)
                return behavior(request, context)
            return noted
        return wrap_handler(continuation(details), wrap)


@contextlib.contextmanager
def channel(node: NameServerNode, tmp_path: Any, where: Where | None = None) -> Iterator[writechannel.WriteChannel]:
    """The core's write channel as server.py makes it (the node's interceptors, WorkerCallers outermost; the
    writes that run on the reader thread), and a worker's end of it."""
    chain = grpcserver.interceptors(node.cfg, outermost=corelink.WorkerCallers(lambda: node.log.apply_offset))
    server = writechannel.WriteChannelServer(f"{tmp_path}/channel/writes.sock", writechannel.WriteCalls(
        NameServerService(node), ([where] if where else []) + chain), 4, 1 << 20,
        inline=frozenset(writechannel.INLINE_WRITES))
    server.start()
    writes = writechannel.WriteChannel(server.path, 1 << 20)
    try:
        yield writes
    finally:
        writes.close()
        server.stop()


def _register(writes: writechannel.WriteChannel, request: api_pb2.RegisterBrokerRequest,
              metadata: tuple[tuple[str, str], ...] = ()) -> writechannel.Answer:
    return writes.call(REGISTER, request.SerializeToString(), CALLER + metadata, 10, lambda: True)


def _core_offset(trailing: Any) -> int:
    return int(next(v for k, v in trailing if k == headers.CORE_OFFSET))


def test_a_write_is_answered_from_the_apply_thread_with_the_offset_as_of_its_apply(
        node: NameServerNode, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    sent_from: list[str] = []
    put = writechannel._Sender.put

    def noted(self: Any, record: list[bytes]) -> None:
        if self.sock.family == 1 and threading.current_thread() is not threading.main_thread():
            sent_from.append(threading.current_thread().name)  # the core's answers (the calls go from here)
        put(self, record)

    monkeypatch.setattr(writechannel._Sender, "put", noted)
    where = Where()
    with channel(node, tmp_path, where) as writes:
        code, details, body, trailing = _register(writes, register_request("c", "b", "10.0.0.1:10911", ["T1", "T2"]))
        assert (code, details) == (grpc.StatusCode.OK, "")
        reply = api_pb2.RegisterBrokerReply.FromString(body)
        assert reply.offset > 0 and reply.records > 0
        assert _core_offset(trailing) >= reply.offset  # the worker's replica waits for the write itself
        assert sent_from == ["apply"]  # no pool thread of the write channel waited for the commit
        assert where.threads == ["write-channel-link"]  # nor ran the call: the link's reader did, to its proposal


def test_a_write_that_would_wait_before_its_proposal_is_the_pools_from_its_start(
        node: NameServerNode, tmp_path: Any) -> None:
    """The budget has no room now: on the reader thread the call would wait, so it stops before it did anything
    (WouldBlock) and the pool runs it from its start, where it waits for room."""
    where = Where()
    with channel(node, tmp_path, where) as writes:
        budget = node.registrations
        budget.held = budget.capacity

        def room() -> None:
            with budget._cond:
                budget.held = 0
                budget._cond.notify_all()

        threading.Timer(0.3, room).start()
        before = node.log.apply_offset
        code, details, body, _ = _register(writes, register_request("c", "b", "10.0.0.1:10911", ["T1"]))
        assert (code, details) == (grpc.StatusCode.OK, "")
        assert api_pb2.RegisterBrokerReply.FromString(body).offset > before
        assert where.threads[0] == "write-channel-link" and where.threads[1].startswith("write-channel_")
        assert len(where.threads) == 2


def test_bad_input_is_refused_naming_the_field_and_nothing_enters_the_log(node: NameServerNode, tmp_path: Any) -> None:
    with channel(node, tmp_path) as writes:
        code, details, _, _ = _register(writes, register_request("c", "", "10.0.0.1:10911", ["T1"]))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and details.startswith("broker_name"), details
        # nothing of it entered: the log's own entries (a new leader's) may land meanwhile, none of this write's
        assert node.inspect(lambda s: (s.route("T1"), len(s.cluster_info().broker_addr_table))) == (None, 0)


def test_an_exactly_once_retry_gets_the_first_reply_and_writes_nothing(node: NameServerNode, tmp_path: Any) -> None:
    session = ((headers.CLIENT_ID, "client-1"), (headers.CLIENT_SEQ, "7"))
    with channel(node, tmp_path) as writes:
        first = _register(writes, register_request("c", "b", "10.0.0.1:10911", ["T1"]), session)
        assert first[0] == grpc.StatusCode.OK
        offset = node.log.apply_offset
        again = _register(writes, register_request("c", "b", "10.0.0.1:10911", ["T1", "T2"]), session)
        assert again[0] == grpc.StatusCode.OK
        assert api_pb2.RegisterBrokerReply.FromString(again[2]) == api_pb2.RegisterBrokerReply.FromString(first[2])
        assert node.log.apply_offset == offset
        assert node.inspect(lambda s: s.route("T2")) is None  # the retry's other topic was never written


def _register_fn(name: str, topics: list[str]) -> Any:
    request = register_request("c", name, "10.0.0.1:10911", topics)
    return lambda s: translate.register_broker(s, request, 30_000)


def _later(node: NameServerNode, fn: Any) -> tuple[Any, list[tuple[WriteResult | None, BaseException | None, str]]]:
    ended: list[tuple[WriteResult | None, BaseException | None, str]] = []
    got = node.write_later(fn, 10, None, register_reply, 1, None,
                           lambda res, err: ended.append((res, err, threading.current_thread().name)))
    return got, ended


def _until(check: Any) -> None:
    for _ in range(1000):
        if check():
            return
        threading.Event().wait(0.01)
    raise AssertionError("not in time")


def test_a_write_that_raced_is_translated_again_where_waiting_is_allowed(node: NameServerNode) -> None:
    with node.lock:  # nothing applies: the second translation reads the state without the first write
        first, first_ended = _later(node, _register_fn("b", ["T1"]))
        second, second_ended = _later(node, _register_fn("b", ["T2"]))
        assert callable(first) and callable(second)
    _until(lambda: first_ended and second_ended)
    assert first_ended[0][1] is None and first_ended[0][2] == "apply"
    result, error, thread = second_ended[0]
    assert error is None and result is not None and result.offset > first_ended[0][0].offset  # type: ignore[union-attr]
    assert thread.startswith("write-again")
    assert node.inspect(lambda s: (s.route("T1") is not None, s.route("T2") is not None)) == (True, True)


def test_a_write_given_up_at_its_time_ends_once_with_its_outcome_unknown(node: NameServerNode) -> None:
    with node.lock:
        give_up, ended = _later(node, _register_fn("b", ["T1"]))
        assert callable(give_up)
        give_up()
        assert len(ended) == 1 and isinstance(ended[0][1], ProposalError) and ended[0][1].unknown_outcome
        assert "timed out" in str(ended[0][1])
    offset = node.log.commit_offset
    assert node.log.wait_applied(offset, 10)  # it commits and applies all the same: outcome unknown, indeed
    threading.Event().wait(0.1)
    assert len(ended) == 1
    assert node.registrations.held == 0


def test_what_needs_a_wait_before_its_proposal_is_write_s_way(node: NameServerNode) -> None:
    """No room in the budget now: None (write() waits for room); nothing was proposed."""
    node.registrations.held = node.registrations.capacity
    try:
        got, ended = _later(node, _register_fn("b", ["T1"]))
        assert got is None and ended == []
    finally:
        node.registrations.held = 0
    assert node.inspect(lambda s: s.route("T1")) is None


class _Servicer:
    def __init__(self, outcome: Any) -> None:
        self.outcome = outcome

    @rpc
    def Raise(self, request: Any, context: Any) -> Any:  # noqa: N802 - as a servicer method
        raise self.outcome

    @rpc
    def Later(self, request: Any, context: Any) -> Any:  # noqa: N802
        later = Later()
        later.fail(self.outcome)
        return later


@pytest.mark.parametrize("error", [
    ProposalError("timed out waiting for the write to commit", unknown_outcome=True),
    ProposalError("queue full"), NotLeader("this node is not the leader"), CasFailed("k", 3, 4),
    TooLargeError("limits.max_topics", "too many"), DeadlinePassed("the call's deadline passed")])
def test_a_later_failure_gets_the_status_a_raise_gets(error: Exception) -> None:
    def status(method: str) -> tuple[Any, ...]:
        context = writechannel.ChannelContext(None, ())
        try:
            got = getattr(_Servicer(error), method)(None, context)
            got.result()
        except writechannel.LocalRpcError as exc:
            return exc.code(), exc.details(), context.trailing()
        raise AssertionError("no status")

    assert status("Later") == status("Raise")


def test_a_later_runs_its_callbacks_in_the_order_given_even_while_it_is_being_set() -> None:
    """WorkerCallers stamps the core's offset in one callback and the channel encodes the answer in the next: a
    callback given while the apply thread runs the first must not run before it, on the giver's thread."""
    later, ran, inside, go_on = Later(), [], threading.Event(), threading.Event()

    def first(_: Later) -> None:
        inside.set()
        go_on.wait(10)
        ran.append(("first", threading.current_thread().name))

    later.then(first)
    setter = threading.Thread(target=later.resolve, args=(1,), name="apply")
    setter.start()
    assert inside.wait(10)
    later.then(lambda got: ran.append(("second", threading.current_thread().name)))
    assert ran == []  # not run here, ahead of the first
    go_on.set()
    setter.join(10)
    assert ran == [("first", "apply"), ("second", "apply")]
    later.then(lambda got: ran.append(("third", threading.current_thread().name)))
    assert ran[-1] == ("third", "MainThread") and later.result() == 1
