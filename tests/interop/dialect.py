"""A JSON body's dialect: where its text departs from standard compact JSON with raw UTF-8.

recorder.parse_body reads fastjson's unquoted keys and standard JSON alike, so a comparison of parsed
bodies cannot see how a body was written. `dialect(text)` reads the text itself and names each departure
by the path flatten() gives the value (list items in flatten's sorted order):

    {0:"a"}            {".0<key>": "unquoted"}
    {"n":"caf\\u00E9"}  {".n": 'written "caf\\u00E9"'}
    { "a" : 1 }        {"<whitespace>": "between tokens"}

Two bodies written alike have equal dialects, whatever their map order.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

_NUMBER = re.compile(r"-?\d+(\.\d+)?([eE][+-]?\d+)?")
_BARE = re.compile(r"[A-Za-z0-9_$.+-]+")
_WS = " \t\r\n"


class _Reader:
    def __init__(self, text: str) -> None:
        self.text, self.i, self.whitespace = text, 0, False

    def skip(self) -> None:
        start = self.i
        while self.i < len(self.text) and self.text[self.i] in _WS:
            self.i += 1
        self.whitespace |= self.i > start

    def string(self) -> tuple[str, str]:
        """(value, lexeme) of the string starting at i."""
        j = self.i + 1
        while self.text[j] != '"':
            j += 2 if self.text[j] == "\\" else 1
        lexeme = self.text[self.i:j + 1]
        self.i = j + 1
        return json.loads(lexeme), lexeme


def _canonical(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def _value(r: _Reader, devs: dict[str, str], path: str, sort_key: Callable[[Any], str]) -> Any:
    r.skip()
    ch = r.text[r.i]
    if ch == "{":
        return _object(r, devs, path, sort_key)
    if ch == "[":
        return _array(r, devs, path, sort_key)
    if ch == '"':
        value, lexeme = r.string()
    else:
        m = _NUMBER.match(r.text, r.i) if ch in "-0123456789" else None
        lexeme = m.group() if m else next(w for w in ("true", "false", "null") if r.text.startswith(w, r.i))
        r.i += len(lexeme)
        value = json.loads(lexeme)
    if lexeme != _canonical(value):
        devs[path] = f"written {lexeme}"
    return value


def _object(r: _Reader, devs: dict[str, str], path: str, sort_key: Callable[[Any], str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    r.i += 1
    r.skip()
    while r.text[r.i] != "}":
        if r.text[r.i] == '"':
            key, lexeme = r.string()
            note = None if lexeme == _canonical(key) else f"written {lexeme}"
        else:
            m = _BARE.match(r.text, r.i)
            assert m is not None, f"not JSON at {r.i}: {r.text[r.i:r.i + 20]!r}"
            key, note = m.group(), "unquoted"
            r.i = m.end()
        if note:
            devs[f"{path}.{key}<key>"] = note
        r.skip()
        assert r.text[r.i] == ":", f"no ':' at {r.i}"
        r.i += 1
        out[key] = _value(r, devs, f"{path}.{key}", sort_key)
        r.skip()
        if r.text[r.i] == ",":
            r.i += 1
            r.skip()
    r.i += 1
    return out


def _array(r: _Reader, devs: dict[str, str], path: str, sort_key: Callable[[Any], str]) -> list[Any]:
    """Items and their departures, renumbered in flatten()'s order (sorted by their JSON)."""
    items: list[tuple[Any, dict[str, str]]] = []
    r.i += 1
    r.skip()
    while r.text[r.i] != "]":
        own: dict[str, str] = {}
        items.append((_value(r, own, "", sort_key), own))
        r.skip()
        if r.text[r.i] == ",":
            r.i += 1
            r.skip()
    r.i += 1
    items.sort(key=lambda item: sort_key(item[0]))
    for n, (_, own) in enumerate(items):
        devs |= {f"{path}[{n}]{sub}": note for sub, note in own.items()}
    return [v for v, _ in items]


def dialect(text: str, alias: Callable[[Any], Any] = lambda v: v) -> dict[str, str]:
    """Departures from standard compact JSON (raw UTF-8), by path; {} for such a body. `alias` is applied to
    list items before they are sorted, as the comparison does. Text that is not JSON: {"": "not JSON"}."""
    devs: dict[str, str] = {}
    r = _Reader(text)
    try:
        _value(r, devs, "", lambda v: json.dumps(alias(v), sort_keys=True, default=str))
        r.skip()
    except (AssertionError, IndexError, StopIteration, ValueError):
        return {"": "not JSON"}
    if r.i != len(text):
        return {"": "not JSON"}
    if r.whitespace:
        devs["<whitespace>"] = "between tokens"
    return devs
