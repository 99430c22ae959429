"""The differential run's comparison (tests/interop/recorder.py, dialect.py) without JVMs, and its one source of
accepted differences: docs/remoting.md's "Still different" table is exactly tests/interop/explained.py's ROWS."""

from __future__ import annotations

import json

from nameserver.remoting import codes
from nameserver.remoting.command import Command
from tests.interop import explained
from tests.interop.dialect import dialect
from tests.interop.jars import LINE_4, LINE_5
from tests.interop.recorder import Exchange, compare


def test_the_docs_table_is_the_explained_list() -> None:
    with open(explained.DOC) as f:
        in_docs = explained.doc_table(f.read())
    assert in_docs is not None, f"docs/remoting.md lacks the markers {explained.BEGIN} ... {explained.END}"
    assert in_docs == explained.table(), "docs/remoting.md is stale: python -m tests.interop.explained --write"


def test_every_row_accepts_something_on_a_line() -> None:
    for row in explained.ROWS:
        assert row.covers and row.lines in ("both", LINE_4, LINE_5), row.what
        assert all(set(c.lines) <= {LINE_4, LINE_5} for c in row.covers), row.what


def test_dialect_names_what_parsing_hides() -> None:
    assert dialect('{"a":{"0":"x"},"b":[1,2]}') == {}
    assert dialect('{"brokerAddrs":{0:"h:1"}}') == {".brokerAddrs.0<key>": "unquoted"}
    assert dialect('{"n":"b \\u00FC"}') == {".n": 'written "b \\u00FC"'}
    assert dialect('{"a": 1}') == {"<whitespace>": "between tokens"}
    assert dialect("listenPort=9876\n") == {"": "not JSON"}
    # list items are numbered in the comparison's sorted order, whatever order they were written in
    written = {"[1].b": 'written "\\u00fc"'}
    assert dialect('[{"b":"\\u00fc"},{"a":1}]') == dialect('[{"a":1},{"b":"\\u00fc"}]') == written


def _exchange(code: int, body: object, raw: bytes | None = None, header: int = codes.SERIALIZE_JSON) -> Exchange:
    req = Command(code=code, version=513, ext_fields={"topic": "T"}, serialize_type=header)
    resp = req.response(body=raw if raw is not None else json.dumps(body, separators=(",", ":")).encode())
    return Exchange(1, 0.0, req, resp)


def test_a_dialect_difference_is_a_difference_no_row_accepts() -> None:
    route = {"brokerDatas": [{"brokerAddrs": {"0": "h:1"}, "brokerName": "b"}]}
    fastjson = b'{"brokerDatas":[{"brokerAddrs":{0:"h:1"},"brokerName":"b"}]}'
    (d,) = compare([_exchange(105, route, fastjson)], [_exchange(105, route)], {}, {})
    assert d.fields == {"raw:body.brokerDatas[0].brokerAddrs.0<key>": ("unquoted", "<absent>")}
    assert not explained.explained(LINE_5, d) and not explained.explained(LINE_4, d)
    assert compare([_exchange(105, route)], [_exchange(105, route)], {}, {}) == []


def test_a_binary_header_answer_is_compared_by_its_header_type() -> None:
    binary = _exchange(105, {}, header=codes.SERIALIZE_ROCKETMQ)
    json_answer = _exchange(105, {}, header=codes.SERIALIZE_ROCKETMQ)
    json_answer.response.serialize_type = codes.SERIALIZE_JSON  # type: ignore[union-attr]
    (d,) = compare([binary], [json_answer], {}, {})
    assert d.fields == {"header": ("ROCKETMQ", "JSON")}
    assert d.request["<header>"] == "ROCKETMQ"
