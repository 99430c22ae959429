"""Frames: int32 total length (not counting itself), int32 header type (top byte) and header length
(low 24 bits), header, body. Every length is checked before anything is read or allocated."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Callable

from nameserver.remoting import codes, header
from nameserver.remoting.command import Command, FrameError, FrameRefused

DEFAULT_MAX_FRAME = 16 << 20  # RocketMQ's own limit (NettySystemConfig frameMaxLength)
# limits.remoting_max_header_bytes: a stock header is a few hundred bytes (a few KB with ACL fields);
# the header is decoded on the listener's one thread, so its size bounds what one frame can stall.
DEFAULT_MAX_HEADER = 64 << 10
_INT32 = struct.Struct(">i")
_PREFIX = struct.Struct(">ii")  # a frame's total length and its header-length word
_HEADER_LENGTH_MASK = 0xFFFFFF


def decode(payload: bytes, max_header: int = DEFAULT_MAX_HEADER,
           max_ext_fields: int = header.DEFAULT_MAX_EXT_FIELDS,
           json_headers: Callable[[bytes], Command] | None = None) -> Command:
    """One frame without its 4-byte length prefix; `json_headers`: what decodes a JSON header instead of
    header.decode_json (a listener's headercache.JsonHeaders, bound by the same max_ext_fields)."""
    if len(payload) < 4:
        raise FrameError(f"frame of {len(payload)} bytes is shorter than its header-length word")
    word = _INT32.unpack_from(payload)[0]
    kind = (word >> 24) & 0xFF
    head_len = word & _HEADER_LENGTH_MASK
    if head_len > len(payload) - 4:
        raise FrameError(f"header length {head_len} exceeds the frame's {len(payload) - 4} bytes")
    check_header_length(head_len, max_header, kind)
    head = payload[4:4 + head_len]
    if kind == codes.SERIALIZE_JSON:
        cmd = header.decode_json(head, max_ext_fields) if json_headers is None else json_headers(head)
        cmd.body = payload[4 + head_len:]
    elif kind == codes.SERIALIZE_ROCKETMQ:
        cmd, used = header.read_rocketmq(head, max_ext_fields)
        # Stock RocketMQ reads the body where the header's fields ended, as long as the header length says
        # the body is: bytes left in the header begin the body and as many at the frame's end are dropped.
        cmd.body = payload[4 + used:len(payload) - (head_len - used)]
    else:
        raise FrameError(f"unknown header serialization type {kind}")
    return cmd


def encode(cmd: Command, serialize_type: int | None = None) -> bytes:
    """The whole frame, length prefix included, its header in `serialize_type` (by default the command's:
    a response's is its request's, as stock RocketMQ answers)."""
    if serialize_type is None:
        serialize_type = cmd.serialize_type
    head = header.encode_rocketmq(cmd) if serialize_type == codes.SERIALIZE_ROCKETMQ else header.encode_json(cmd)
    if len(head) > _HEADER_LENGTH_MASK:
        raise FrameError(f"header of {len(head)} bytes does not fit in 24 bits")
    # one pack and one join: every reply passes here (a route read's is most of them)
    return b"".join((_PREFIX.pack(4 + len(head) + len(cmd.body), (serialize_type << 24) | len(head)), head, cmd.body))


def check_header_length(head_len: int, max_header: int, kind: int) -> None:
    if head_len > max_header:
        raise FrameRefused(f"header of {head_len} bytes exceeds limits.remoting_max_header_bytes ({max_header})",
                           kind)


async def read(reader: asyncio.StreamReader, max_frame: int = DEFAULT_MAX_FRAME) -> bytes | None:
    """The next frame's payload from a stream (the core channel's link; the public listener cuts frames
    out of what it receives, `whole`); None at a clean end of stream (between frames). Raises FrameError
    for a bad length and asyncio.IncompleteReadError for a stream cut mid-frame."""
    prefix = await reader.read(4)
    if not prefix:
        return None
    if len(prefix) < 4:
        prefix += await reader.readexactly(4 - len(prefix))
    total = _INT32.unpack(prefix)[0]
    check_frame_length(total, max_frame)
    return await reader.readexactly(total)


def check_frame_length(total: int, max_frame: int) -> None:
    if total < 4:
        raise FrameError(f"frame length {total} is below the minimum of 4")
    if total > max_frame:
        raise FrameError(f"frame length {total} exceeds the {max_frame}-byte limit")


def check_header_word(word: int, total: int, max_header: int) -> None:
    """A header-length word over `max_header` is refused before the rest of its frame is read."""
    head_len = word & _HEADER_LENGTH_MASK
    if head_len <= total - 4:  # else malformed, not too large: decode says so
        check_header_length(head_len, max_header, (word >> 24) & 0xFF)


def whole(buf: bytearray, max_frame: int, max_header: int) -> int:
    """The bytes of the frame at the start of `buf` (its length prefix too) once all of them are there, else 0.
    A bad length, or a header-length word over `max_header`, raises as `read` does as soon as it is there."""
    have = len(buf)
    if have < 8:  # the length alone so far: checked now, the header word once it is there
        if have >= 4:
            check_frame_length(_INT32.unpack_from(buf)[0], max_frame)
        return 0
    total, word = _PREFIX.unpack_from(buf)
    if not 4 <= total <= max_frame or word & _HEADER_LENGTH_MASK > max_header:  # the calls only to raise
        check_frame_length(total, max_frame)
        check_header_word(word, total, max_header)
    return 4 + total if have >= 4 + total else 0
