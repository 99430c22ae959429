"""JSON as fastjson writes and reads it.

fastjson (RocketMQ's serializer) writes maps with non-string keys with the keys unquoted:
`"brokerAddrs":{0:"10.0.0.1:10911"}`. Old clients expect exactly that; newer ones ask for standard
JSON. `dumps` writes either form (integer dict keys are the "numeric map keys"), with keys sorted like
fastjson's MapSortField, and non-ASCII characters as raw UTF-8 in both, as 5.x's fastjson2 writes every
body (4.9's fastjson escapes them in routes for clients from 4.9.4: JSON-equal, and the differential run
lists it). `loads` reads both.
"""

from __future__ import annotations

import json
import re
from typing import Any

_BARE_KEY = re.compile(r"[A-Za-z0-9_$.+-]+")


def dumps(obj: Any, fastjson: bool = False) -> bytes:
    """Compact JSON bytes (UTF-8, non-ASCII characters raw); with fastjson=True integer map keys are
    written unquoted."""
    out: list[str] = []
    _write(obj, fastjson, out)
    return "".join(out).encode("utf-8")


def _write(obj: Any, fastjson: bool, out: list[str]) -> None:
    if isinstance(obj, dict):
        out.append("{")
        for i, key in enumerate(sorted(obj, key=lambda k: (isinstance(k, str), k))):
            if i:
                out.append(",")
            if isinstance(key, int) and not isinstance(key, bool):
                out.append(str(key) if fastjson else f'"{key}"')
            else:
                out.append(json.dumps(str(key), ensure_ascii=False))
            out.append(":")
            _write(obj[key], fastjson, out)
        out.append("}")
    elif isinstance(obj, list | tuple):
        out.append("[")
        for i, item in enumerate(obj):
            if i:
                out.append(",")
            _write(item, fastjson, out)
        out.append("]")
    else:
        out.append(json.dumps(obj, ensure_ascii=False))


def loads(text: str) -> Any:
    """Standard JSON, or fastjson's with unquoted object keys.

    Every failure is a ValueError: nesting too deep for the parser (RecursionError) and strings with a
    lone surrogate escape ("\\ud800", which no UTF-8 encoder accepts later on) included."""
    try:
        doc = _loads(text)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None
    if _SURROGATE_ESCAPE.search(text) and _has_surrogate(doc):
        raise ValueError("JSON string with a lone surrogate (\\ud800-\\udfff escape)")
    return doc


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")  # only such escapes can produce a surrogate
_SURROGATES = re.compile("[\ud800-\udfff]")


def _loads(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        quoted = _quote_bare_keys(text)
        if quoted == text:
            raise
        return json.loads(quoted)


def _has_surrogate(doc: Any) -> bool:
    # Iterative: the document may be nested as deeply as the parser allowed.
    stack = [doc]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if _SURROGATES.search(item):
                return True
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def _quote_bare_keys(text: str) -> str:
    """Put quotes around object keys written bare (outside strings, after '{' or ',')."""
    out: list[str] = []
    i, n = 0, len(text)
    expect_key = False
    while i < n:
        ch = text[i]
        if ch == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append(text[i:j + 1])
            i = j + 1
            expect_key = False
            continue
        if ch in "{,":
            expect_key = True
        elif expect_key and not ch.isspace():
            m = _BARE_KEY.match(text, i)
            if m is not None:
                k = m.end()
                while k < n and text[k].isspace():
                    k += 1
                if k < n and text[k] == ":":
                    out.append(f'"{m.group()}"')
                    i = m.end()
                    expect_key = False
                    continue
            expect_key = False
        out.append(ch)
        i += 1
    return "".join(out)
