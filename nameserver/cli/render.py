"""Rendering helpers for nsctl: plain aligned tables and deterministic JSON."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

from google.protobuf import json_format
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

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

# RocketMQ PermName bits, highest first.
_PERM_BITS = ((8, "P"), (4, "R"), (2, "W"), (1, "I"))


def to_dict(message: Message) -> dict[str, Any]:
    """A message as a JSON-ready dict: snake_case names, every field present, int64 fields as ints."""
    data = json_format.MessageToDict(
        message,
        preserving_proto_field_name=True,
        always_print_fields_with_no_presence=True,
    )
    return _fix_message(message.DESCRIPTOR, data)


def _fix_message(descriptor: Any, data: dict[str, Any]) -> dict[str, Any]:  # python or upb Descriptor
    for field in descriptor.fields:
        if field.name in data:
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
    """One table cell as text: booleans as yes/no, missing values as '-'."""
    if value is None or value == "":
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


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
