"""atheris target: RegisterBrokerBody and the other request bodies (TopicRouteData, DataVersion).

The first byte picks the form: bit 0 = compressed; bit 1 = the rest is the inflated content, zlib
compressed here (so the fuzzer can reach the compressed parser's fields). Contract: BodyError or a
body whose topic configs are sendable protobuf. Anything else escaping is a crash.

    python tests/fuzz/atheris_targets/register_body.py -max_total_time=60 tests/fuzz/corpus/register_body
"""

from __future__ import annotations

import contextlib
import zlib

import _setup
import atheris

with atheris.instrument_imports(include=_setup.INSTRUMENTED):
    from nameserver.remoting import bodies, registerbody
    from nameserver.remoting.bodies import BodyError


def test_one_input(data: bytes) -> None:
    if not data:
        return
    flags, body = data[0], data[1:]
    compressed = bool(flags & 1)
    if flags & 2:
        body = zlib.compress(body)
    try:
        out = registerbody.decode(body, compressed)
    except BodyError:
        out = None
    if out is not None:
        for tc in out.topics:
            tc.SerializeToString()
        out.data_version.SerializeToString()
    if not compressed:
        for parse in (bodies.parse_queue_datas,
                      lambda b: bodies.parse_data_version(bodies.parse_json(b, "DataVersion"))):
            with contextlib.suppress(BodyError):
                parse(body)


if __name__ == "__main__":
    _setup.run(test_one_input)
