"""Text from outside (names, keys, values a client chose) made safe to show in a log line or on a terminal.

Such text may hold a newline or carriage return (a forged log line or table row), ESC or a C1 control
(terminal escape sequences: colours, a window title, an OSC 52 clipboard write, cursor moves that hide
what came before), the Unicode line separators, bidi overrides (text shown other than it reads) or a
lone surrogate (which a UTF-8 stream cannot even write). Each is written as Python's repr writes it
(`\\n`, `\\x1b`, `\\x9b`, `\\u2028`), so the original can still be read off.

`shown(value)` is for a client's value inside a log message: escaped, backslashes too, and cut to a
bounded length. The log formatters (nameserver/ops/logfmt.py) and nsctl's output escape what reaches
them anyway; `shown` adds the length bound and makes the escaping visible where the value is logged.
"""

from __future__ import annotations

from typing import Any

SHOWN_LIMIT = 200  # characters of a client's value in a log line: enough to recognise it

_UNSAFE = (
    [*range(0x00, 0x20), *range(0x7F, 0xA0)]        # C0 controls, DEL, C1 controls
    + [0x2028, 0x2029]                              # line and paragraph separators
    + [*range(0x202A, 0x202F), *range(0x2066, 0x206A)]  # bidi embeddings, overrides and isolates
    + [*range(0xD800, 0xE000)]                      # surrogates (only ever alone in a str)
)
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(cp: int) -> str:
    return _NAMED.get(chr(cp)) or (f"\\x{cp:02x}" if cp < 0x100 else f"\\u{cp:04x}")


_TABLE = {cp: _escape(cp) for cp in _UNSAFE}
_TABLE_LINES = {cp: s for cp, s in _TABLE.items() if chr(cp) not in "\n\t"}
_TABLE_SHOWN = _TABLE | {ord("\\"): "\\\\"}
# json.dumps(ensure_ascii=False) escapes C0 controls itself; the rest must be \uXXXX to stay JSON.
_TABLE_JSON = {cp: f"\\u{cp:04x}" for cp in _UNSAFE if cp >= 0x20}


def escape_controls(text: str) -> str:
    """`text` on one line with every control character escaped (backslashes left as they are)."""
    return text.translate(_TABLE)


def escape_controls_in_lines(text: str) -> str:
    """Like escape_controls, but newlines and tabs kept: for multi-line text this program composed (a
    traceback, a table) whose values were escaped already, so that no terminal escape gets through."""
    return text.translate(_TABLE_LINES)


def escape_for_json(text: str) -> str:
    """The output of json.dumps(..., ensure_ascii=False) with DEL, C1 controls, line separators, bidi
    controls and surrogates as \\uXXXX escapes too: still the same JSON, but safe on a terminal."""
    return text.translate(_TABLE_JSON)


def shown(value: Any, limit: int = SHOWN_LIMIT) -> str:
    """A client's value for a log message: control characters and backslashes escaped, at most `limit`
    characters of it, then "...(N more bytes)" for what was cut (bytes of its UTF-8)."""
    raw = isinstance(value, bytes | bytearray)
    text = bytes(value).decode("utf-8", "backslashreplace") if raw else str(value)
    return cut(text, limit, _TABLE_SHOWN)


def cut(text: str, limit: int, table: dict[int, str] = _TABLE) -> str:
    """`text` escaped with `table`, cut after at most `limit` characters of output (never inside an
    escape), with "...(N more bytes)" naming the UTF-8 size of what was left out."""
    head = text[:limit]  # every character gives at least one: no more than `limit` are needed
    escaped = head.translate(table)
    if len(escaped) <= limit and len(head) == len(text):
        return escaped
    out: list[str] = []
    used = 0
    for i, ch in enumerate(head):
        piece = table.get(ord(ch), ch)
        if used + len(piece) > limit:
            rest = text[i:]
            break
        out.append(piece)
        used += len(piece)
    else:
        rest = text[len(head):]
    return "".join(out) + f"...({len(rest.encode('utf-8', 'surrogatepass'))} more bytes)"
