"""A worker's READ_INDEX asks on the core's end of the write channel (nameserver/api/writechannel.py,
WriteChannelServer's `read_index`): once the interceptors admitted an ask with the same metadata, an ask is
answered by the core's read index without a pool thread or the interceptors, at once or when the index comes
later; an ask with other metadata still meets the interceptors; an ask that way finds no index goes the
waiting way. On a real Unix socket in this process."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any

import grpc

from nameserver import headers
from nameserver.api import corelink, writechannel
from nameserver.pb import api_pb2, api_pb2_grpc

CALLER = ((headers.WORKER_CALLER, json.dumps({"self": True})),)
READ = writechannel.READ_INDEX


def test_a_read_index_ask_skips_the_pool_only_with_metadata_the_interceptors_admitted(tmp_path: Any) -> None:
    waited: list[str] = []  # the waiting way's handler (behind the interceptors): who called
    later: list[Callable[[int | None], None]] = []
    now: list[int | None] = [None]

    def handler(request: api_pb2.ReadIndexRequest, context: grpc.ServicerContext) -> api_pb2.ReadIndexReply:
        waited.append(context.peer())
        return api_pb2.ReadIndexReply(read_index=5)

    def start(done: Callable[[int | None], None]) -> int | None:
        if now[0] is None:
            later.append(done)
        return now[0]

    calls = writechannel.WriteCalls(api_pb2_grpc.NameServerServicer(), [corelink.WorkerCallers(lambda: 1)])
    calls.handlers[READ] = grpc.unary_unary_rpc_method_handler(
        handler, request_deserializer=api_pb2.ReadIndexRequest.FromString,
        response_serializer=api_pb2.ReadIndexReply.SerializeToString)
    server = writechannel.WriteChannelServer(f"{tmp_path}/channel/writes.sock", calls, 4, 1 << 20, read_index=start)
    server.start()
    writes = writechannel.WriteChannel(server.path, 1 << 20)

    def ask(metadata: writechannel.Metadata = CALLER) -> writechannel.Answer:
        answer, _ = writes.start(READ, b"", metadata, 5)
        return answer.result(5)

    def index(answer: writechannel.Answer) -> int:
        assert answer[0] == grpc.StatusCode.OK, answer
        return api_pb2.ReadIndexReply.FromString(answer[2]).read_index

    try:
        refused = ask(())  # no CALLER: the interceptors refuse it
        assert refused[0] == grpc.StatusCode.UNAUTHENTICATED and waited == [] and later == []
        assert index(ask()) == 5 and waited == ["worker"]  # the first with this metadata: the waiting way
        now[0] = 9
        assert index(ask()) == 9 and waited == ["worker"]  # admitted: the core's index at once
        now[0] = None
        pending, _ = writes.start(READ, b"", CALLER, 5)
        while not later:
            threading.Event().wait(0.01)
        assert not pending.done()
        threading.Thread(target=later[0], args=(12,)).start()  # as the Raft tick thread answers
        assert index(pending.result(5)) == 12 and waited == ["worker"]
        pending, _ = writes.start(READ, b"", CALLER, 5)
        while len(later) < 2:
            threading.Event().wait(0.01)
        later[1](None)  # no index that way: the waiting way answers
        assert index(pending.result(5)) == 5 and waited == ["worker", "worker"]
        # other metadata than the admitted one: the interceptors decide it first, whatever came before
        assert ask(((headers.WORKER_CALLER, "not json"),))[0] == grpc.StatusCode.UNAUTHENTICATED
        assert ask(())[0] == grpc.StatusCode.UNAUTHENTICATED
        assert len(later) == 2 and len(waited) == 2
    finally:
        writes.close()
        server.stop()
