"""The remoting decoders on arbitrary and mutated input, and the handlers on arbitrary commands.

The contract (nameserver/remoting/server.py): frame.decode and the header codecs raise FrameError (the
connection is closed), the body parsers BodyError (the request gets SYSTEM_ERROR). Any other exception
is a bug: the server either drops the connection without a word or answers "internal error". Nothing
may take long: every length is checked before anything is read.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from nameserver.remoting import bodies, codes, frame, header, registerbody
from nameserver.remoting.bodies import BodyError
from nameserver.remoting.command import Command, FrameError
from tests.fuzz import remotingharness
from tests.fuzz import remotingstrategies as rs
from tests.fuzz.profile import fuzz_settings

QUICK_S = 2.0  # generous for a loaded CI machine; the inputs here are at most a few MiB


def bounded(fn: Callable[[], Any], allowed: type[Exception]) -> Any:
    """fn() returns, or raises `allowed`, and does so quickly."""
    t0 = time.monotonic()
    try:
        return fn()
    except allowed:
        return None
    finally:
        assert time.monotonic() - t0 < QUICK_S, f"took {time.monotonic() - t0:.1f}s"


def same(a: Command, b: Command) -> bool:
    fields = ("code", "language", "version", "opaque", "flag", "remark", "ext_fields", "body")
    return all(getattr(a, f) == getattr(b, f) for f in fields)


@fuzz_settings(300)
@given(st.one_of(st.binary(max_size=300), rs.mutated(), rs.raw_json_frames()))
def test_frame_decode_returns_or_raises_frame_error(payload: bytes) -> None:
    for data in (payload, payload[4:]):  # with and without the length prefix
        cmd = bounded(lambda d=data: frame.decode(d), FrameError)
        if cmd is not None:  # what decodes must encode again (we answer every request we decode)
            frame.encode(cmd.response(codes.SUCCESS, cmd.remark, cmd.ext_fields))


@fuzz_settings(150)
@given(rs.commands(), st.booleans())
def test_frames_round_trip(cmd: Command, binary: bool) -> None:
    kind = codes.SERIALIZE_ROCKETMQ if binary else codes.SERIALIZE_JSON
    data = frame.encode(cmd, kind)
    back = frame.decode(data[4:], max_header=len(data), max_ext_fields=len(cmd.ext_fields))  # the codec, not limits
    if binary:  # the binary header carries the language as an index, and "" as null (no remark, no field)
        cmd.remark = cmd.remark or None
        cmd.ext_fields = {key: value for key, value in cmd.ext_fields.items() if key and value}
    assert same(back, cmd)


@fuzz_settings(300)
@given(st.one_of(rs.json_values(), st.fixed_dictionaries({"code": st.one_of(rs.INT32, rs.JSON_SCALARS)}, optional={
    "extFields": st.one_of(st.dictionaries(st.text(max_size=5), rs.json_values(4)), rs.json_values(3)),
    "version": rs.JSON_SCALARS, "opaque": rs.JSON_SCALARS, "flag": rs.JSON_SCALARS, "remark": rs.json_values(2),
    "language": rs.json_values(2)})), st.sampled_from(["", "\n", " "]))
def test_json_header_documents(doc: Any, tail: str) -> None:
    data = json.dumps(doc).encode() + tail.encode()
    cmd = bounded(lambda: header.decode_json(data), FrameError)
    if cmd is not None:
        assert same(header.decode_json(header.encode_json(cmd)), cmd)


@fuzz_settings(200)
@given(st.one_of(st.binary(max_size=200), rs.commands().map(header.encode_rocketmq).flatmap(
    lambda h: rs.mutated(st.just(h)))))
def test_binary_header_bytes(data: bytes) -> None:
    cmd = bounded(lambda: header.decode_rocketmq(data), FrameError)
    if cmd is not None:
        assert same(header.decode_rocketmq(header.encode_rocketmq(cmd)), cmd)


@fuzz_settings(300)
@given(st.one_of(rs.register_bodies(), st.tuples(rs.mutated(rs.register_bodies().map(lambda bc: bc[0])),
                                                  st.booleans())))
def test_register_body_returns_or_raises_body_error(body_compressed: tuple[bytes, bool]) -> None:
    body, compressed = body_compressed
    out = bounded(lambda: registerbody.decode(body, compressed), BodyError)
    if out is not None:
        for tc in out.topics:  # what decodes must be a sendable request part
            tc.SerializeToString()


@fuzz_settings(200)
@given(rs.request_bodies())
def test_other_bodies_return_or_raise_body_error(body: bytes) -> None:
    bounded(lambda: bodies.parse_queue_datas(body), BodyError)
    bounded(lambda: bodies.parse_data_version(bodies.parse_json(body, "DataVersion")), BodyError)


@fuzz_settings(200)
@given(st.one_of(st.binary(max_size=64), rs.mutated()))
def test_frame_read_on_any_stream(data: bytes) -> None:
    async def read_all() -> None:
        reader = asyncio.StreamReader()
        reader.feed_data(data)
        reader.feed_eof()
        while (payload := await frame.read(reader, max_frame=1 << 16)) is not None:
            assert len(payload) >= 4

    bounded(lambda: asyncio.run(read_all()), (FrameError, asyncio.IncompleteReadError))  # type: ignore[arg-type]


def _decoded(data: bytes) -> Command | None:
    try:
        return frame.decode(data[4:])
    except FrameError:
        return None


@fuzz_settings(150)
@given(st.lists(st.one_of(rs.commands(any_code=False), rs.raw_json_frames().map(_decoded)), min_size=1,
                max_size=6))
def test_handlers_answer_every_command(cmds: list[Command | None]) -> None:
    """Every decoded request gets an encodable response (as the server sends it), whatever it holds:
    an exception out of Handlers.handle would become "internal error" and a logged traceback."""
    h = remotingharness.handlers()
    for cmd in cmds:
        if cmd is None:
            continue
        resp = h.handle(cmd)
        assert resp.opaque == cmd.opaque and resp.is_response
        # a response is read by the client, not by our listener's header bound: a remark may echo a field
        # of up to that bound (stock does too), so the answer's header may pass it by a few bytes
        back = frame.decode(frame.encode(resp)[4:], max_header=1 << 24)
        assert back.code == resp.code
