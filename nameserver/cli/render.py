"""Rendering helpers for nsctl: plain aligned tables and deterministic JSON.

Names, keys and values in a reply are whatever some client wrote, so nothing nsctl prints may carry a
control character (nameserver/safetext.py): a table cell or a value on its own line is escaped onto
its line (a newline in a value cannot forge a row), and while nsctl runs its stdout and stderr escape
every control character but newline and tab, so no terminal escape gets through a path that forgot.
--json needs neither: json.dumps writes ASCII with every control character escaped.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, TextIO

from google.protobuf import json_format
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from nameserver.safetext import escape_controls, escape_controls_in_lines

# MessageToDict renders these as strings (JSON numbers lose precision past 2**53); we want ints.
_INT64_TYPES = frozenset(
    {
        FieldDescriptor.TYPE_INT64,
        FieldDescriptor.TYPE_UINT64,
        FieldDescriptor.TYPE_SINT64,
        FieldDescriptor.TYPE_FIXED64,
        FieldDescriptor.TYPE_SFIXED64,
    }
)

# Sharding's offset vectors (docs/api.md, "Offsets with several Raft groups"): printed only when the cluster
# answered one, so a one-group cluster's JSON is what it was before they existed.
_WHEN_SET = frozenset({"offsets", "min_offsets"})

# RocketMQ PermName bits, highest first.
_PERM_BITS = ((8, "P"), (4, "R"), (2, "W"), (1, "I"))


def to_dict(message: Message) -> dict[str, Any]:
    """A message as a JSON-ready dict: snake_case names, every field present (but an empty offset vector),
    int64 fields as ints."""
    data = json_format.MessageToDict(
        message,
        preserving_proto_field_name=True,
        always_print_fields_with_no_presence=True,
    )
    return _fix_message(message.DESCRIPTOR, data)


def _fix_message(descriptor: Any, data: dict[str, Any]) -> dict[str, Any]:  # python or upb Descriptor
    for field in descriptor.fields:
        if field.name in _WHEN_SET and not data.get(field.name):
            data.pop(field.name, None)
        elif field.name in data:
            data[field.name] = _fix_field(field, data[field.name])
    return data


def _fix_field(field: FieldDescriptor, value: Any) -> Any:
    entry = field.message_type
    if entry is not None and entry.GetOptions().map_entry:
        # JSON object keys stay strings; only the values need fixing.
        value_field = entry.fields_by_name["value"]
        return {key: _fix_single(value_field, item) for key, item in value.items()}
    if field.is_repeated:
        return [_fix_single(field, item) for item in value]
    return _fix_single(field, value)


def _fix_single(field: FieldDescriptor, value: Any) -> Any:
    if field.message_type is not None:
        return _fix_message(field.message_type, value)
    if field.type in _INT64_TYPES:
        return int(value)
    return value


def dump_json(data: Any) -> str:
    """Deterministic JSON (sorted keys) for scripts and diffs."""
    return json.dumps(data, sort_keys=True, indent=2)


def cell(value: Any) -> str:
    """One table cell as text on one line: booleans as yes/no, missing values as '-'."""
    if value is None or value == "":
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return escape_controls(str(value))


class _EscapedStream(io.TextIOBase):
    """Writes through to `inner` with every control character but newline and tab escaped."""

    def __init__(self, inner: TextIO) -> None:
        self.inner = inner

    def write(self, text: str) -> int:
        self.inner.write(escape_controls_in_lines(text))
        return len(text)

    def flush(self) -> None:
        self.inner.flush()

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return self.inner.isatty()


@contextlib.contextmanager
def escaped_output() -> Iterator[None]:
    """sys.stdout and sys.stderr escape control characters (not newline or tab) while this lasts."""
    out, err = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _EscapedStream(out), _EscapedStream(err)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = out, err


def _is_number(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _numeric_column(values: list[Any]) -> bool:
    # Missing cells ('-') do not stop a column of numbers from lining up on the right.
    present = [value for value in values if value is not None]
    return bool(present) and all(_is_number(value) for value in present)


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """Plain aligned columns separated by two spaces; numeric columns are right-aligned."""
    raw_rows = [list(row) for row in rows]
    if not raw_rows:
        return "  ".join(headers) + "\n(none)"
    numeric = [_numeric_column([row[i] for row in raw_rows]) for i in range(len(headers))]
    text_rows = [list(headers)] + [[cell(value) for value in row] for row in raw_rows]
    widths = [max(len(row[i]) for row in text_rows) for i in range(len(headers))]
    lines = []
    for row in text_rows:
        parts = [
            text.rjust(width) if is_num else text.ljust(width)
            for text, width, is_num in zip(row, widths, numeric, strict=True)
        ]
        lines.append("  ".join(parts).rstrip())
    return "\n".join(lines)


def perm_text(perm: int) -> str:
    """A RocketMQ permission as its number and letters, e.g. 6 -> '6 (RW)'."""
    letters = "".join(letter for bit, letter in _PERM_BITS if perm & bit)
    return f"{perm} ({letters or '-'})"


def plural(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"
