"""atheris target: bytes parsed as a NameServer request and served by the real servicer, without sockets.

The first byte picks the method (tests.fuzz.inprocess.methods(), sorted by name); the rest is the
serialized request (for RegisterBrokerStream, chunks separated by b"\\xff\\xfe"). The servicer runs over
an in-memory node seeded with a small state. Contract: a reply or an abort with a documented status;
INVALID_ARGUMENT names a field; a refused request writes nothing; a replay of the log gives the same
state. Anything else (an exception: UNKNOWN to a client) is a crash.

    python tests/fuzz/atheris_targets/grpc_requests.py -max_total_time=60 tests/fuzz/corpus/grpc_requests
"""

from __future__ import annotations

import _setup
import atheris

with atheris.instrument_imports(include=_setup.INSTRUMENTED):
    import grpc
    from google.protobuf.message import DecodeError

    from nameserver.pb import api_pb2
    from tests.fuzz import seeds, statecheck
    from tests.fuzz.inprocess import Servicer, methods, replay
    from tests.fuzz.livecalls import REFUSALS, all_methods, check_status

NAMES = seeds.METHOD_NAMES
LIVE = all_methods()
SEED_ENTRIES = seeds.seed_entries()


def _parse(name: str, raw: bytes) -> object | None:
    cls, streaming = methods()[name]
    try:
        if streaming:
            return [api_pb2.RegisterBrokerChunk.FromString(part) for part in raw.split(seeds.STREAM_SEPARATOR)]
        return cls.FromString(raw)
    except DecodeError:
        return None


def test_one_input(data: bytes) -> None:
    if not data:
        return
    name = NAMES[data[0] % len(NAMES)]
    request = _parse(name, data[1:])
    if request is None:
        return
    svc = Servicer()
    svc.node.state = replay(SEED_ENTRIES)
    svc.node.entries = list(SEED_ENTRIES)
    before, digest = len(svc.node.entries), svc.node.state.digest_hex
    out = svc.call(name, request)  # an exception here is the crash we look for
    check_status(LIVE[name], None if isinstance(request, list) else request, out.code, out.details,
                 SEED_ENTRIES[-1][0], True)
    if out.code in REFUSALS - {grpc.StatusCode.FAILED_PRECONDITION} and len(svc.node.entries) != before:
        raise AssertionError(f"{name} refused ({out.code.name}) but wrote to the log")
    if out.code == grpc.StatusCode.FAILED_PRECONDITION and svc.node.state.digest_hex != digest:
        raise AssertionError(f"{name} refused but changed the state")
    if statecheck.oversized_keys(svc.node.state):  # every later snapshot would fail
        raise AssertionError(f"{name} stored a key longer than a snapshot can hold")
    if replay(svc.node.entries).digest_hex != svc.node.state.digest_hex:
        raise AssertionError(f"{name}: a replay of the log diverges from the state")


if __name__ == "__main__":
    _setup.run(test_one_input)
