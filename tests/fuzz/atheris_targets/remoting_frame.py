"""atheris target: a remoting frame (without its length prefix) through frame.decode and the header codecs.

Contract: FrameError or a Command; a decoded command re-encodes (both header forms) to the same fields,
and the response the server would send encodes. Anything else escaping is a crash.

    python tests/fuzz/atheris_targets/remoting_frame.py -max_total_time=60 tests/fuzz/corpus/remoting_frame
"""

from __future__ import annotations

import _setup
import atheris

with atheris.instrument_imports(include=_setup.INSTRUMENTED):
    from nameserver.remoting import codes, frame, header
    from nameserver.remoting.command import Command, FrameError

FIELDS = ("code", "language", "version", "opaque", "flag", "remark", "ext_fields", "body")


def _same(a: Command, b: Command) -> bool:
    return all(getattr(a, f) == getattr(b, f) for f in FIELDS)


def test_one_input(data: bytes) -> None:
    try:
        cmd = frame.decode(data)
    except FrameError:
        cmd = None
    if cmd is not None:
        frame.encode(cmd.response(codes.SUCCESS, cmd.remark, cmd.ext_fields, cmd.body))
        again = frame.decode(frame.encode(cmd)[4:])
        if not _same(again, cmd):
            raise AssertionError(f"JSON round trip changed {cmd} into {again}")
    try:  # the binary header codec on its own (its lengths are the interesting part)
        binary = header.decode_rocketmq(data)
    except FrameError:
        return
    if not _same(header.decode_rocketmq(header.encode_rocketmq(binary)), binary):
        raise AssertionError(f"binary round trip changed {binary}")


if __name__ == "__main__":
    _setup.run(test_one_input)
