"""Log output: human text (the default) or one JSON object per line (`--log-format json`).

Code that logs an event an operator may want to find or count passes its fields through
`extra={"event": ..., ...}`. The JSON formatter writes every such field as a top-level key, and the
text formatter appends them as `key=value` so both formats can be grepped for `event=leader_change`.

Events logged with an `event` field (one line each):
    leader_change        every node, when it sees a new leader (nameserver.ops.metrics.LeaderWatch)
    broker_expired       the leader, per broker address removed for silence (nameserver.core.node)
    snapshot_written     every node, per snapshot file written (raftlog.log)
    snapshot_restored    a node that installed a snapshot from its disk or from the leader (raftlog.applier)
    membership_change    the node that applied a member add/remove (nameserver membership work)

Whatever a record holds, a formatted record is one line (its traceback aside, indented) with no control
character: a message's newlines, carriage returns, ESC and C1 controls are escaped
(nameserver/safetext.py), and a message is cut at MAX_MESSAGE_CHARS. So a client's name that reaches
a message unescaped still cannot forge a line or send a terminal escape to whoever reads the log.
`configure` also holds back repeats (nameserver/logthrottle.py: RepeatFilter), so no line a caller
can cause at will fills the disk.
"""

from __future__ import annotations

import datetime
import json
import logging
import sys
import textwrap
import tomllib
from typing import Any, TextIO

from nameserver.logthrottle import RepeatFilter
from nameserver.safetext import cut, escape_controls, escape_controls_in_lines, escape_for_json

FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
TRACE_INDENT = "  "
# Longer messages are cut. Generous: the longest this code writes is every thread's stack at a tick
# stall (raftlog/tickwatch.py), a few KiB per thread, one line here with its newlines escaped.
MAX_MESSAGE_CHARS = 64 * 1024

# Every attribute a plain LogRecord has; anything else on a record came from `extra=`.
_STANDARD_ATTRS = frozenset(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime"}


def extra_fields(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in record.__dict__.items() if k not in _STANDARD_ATTRS and not k.startswith("_")}


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return str(value)


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts (RFC 3339, UTC, ms), level, logger, msg, thread, extra fields."""

    def __init__(self, static: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.static = dict(static or {})

    def format(self, record: logging.LogRecord) -> str:
        ts = datetime.datetime.fromtimestamp(record.created, tz=datetime.UTC)
        doc: dict[str, Any] = {
            "ts": ts.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "msg": cut(record.getMessage(), MAX_MESSAGE_CHARS, {}),
            "thread": record.threadName,
        }
        doc.update(self.static)
        for key, value in extra_fields(record).items():
            # An extra field never overwrites the envelope: a caller's "msg" would hide the message.
            doc.setdefault(key, _jsonable(value))
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        if record.stack_info:
            doc["stack"] = self.formatStack(record.stack_info)
        return escape_for_json(json.dumps(doc, ensure_ascii=False, separators=(",", ":")))


class TextFormatter(logging.Formatter):
    """The classic one-line format, with extra fields appended as key=value. The message is escaped
    onto its line; a traceback keeps its own lines, indented, its control characters escaped."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def formatMessage(self, record: logging.LogRecord) -> str:
        return cut(super().formatMessage(record), MAX_MESSAGE_CHARS)  # one line, controls escaped

    # A traceback is indented: every line at column 0 is a record, whatever an exception's text says.
    def formatException(self, ei: Any) -> str:
        return textwrap.indent(escape_controls_in_lines(super().formatException(ei)), TRACE_INDENT)

    def formatStack(self, stack_info: str) -> str:
        return textwrap.indent(escape_controls_in_lines(super().formatStack(stack_info)), TRACE_INDENT)

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        fields = extra_fields(record)
        if not fields:
            return line
        suffix = " ".join(f"{k}={_text_value(v)}" for k, v in fields.items())
        head, sep, tail = line.partition("\n")  # keep a traceback below the fields
        return f"{head} [{suffix}]{sep}{tail}"


def _text_value(value: Any) -> str:
    text = str(value)
    # json.dumps writes ASCII only: a value with a space or any control character stays one token
    return json.dumps(text) if (not text or escape_controls(text) != text or any(c.isspace() for c in text)) \
        else text


def make_formatter(fmt: str, static: dict[str, Any] | None = None) -> logging.Formatter:
    if fmt == "json":
        return JsonFormatter(static)
    if fmt == "text":
        return TextFormatter()
    raise ValueError(f"log format must be one of {', '.join(FORMATS)}, not {fmt!r}")


def configure(fmt: str = "text", level: str = "INFO", static: dict[str, Any] | None = None,
              stream: TextIO | None = None) -> logging.Handler:
    """Route the root logger to one stream handler in `fmt`; returns that handler."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(make_formatter(fmt, static))
    handler.addFilter(RepeatFilter())  # no line a caller can repeat fills the disk (nameserver/logthrottle.py)
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    logging.getLogger("pysyncobj").setLevel(logging.WARNING)
    return handler


def format_from_config(path: str | None) -> str | None:
    """`[log] format` from a node's TOML file, or None when absent (the flag or default applies).

    Read here rather than in nameserver.config because logging is set up before, and independently
    of, the node's configuration being valid.
    """
    if not path:
        return None
    try:
        with open(path, "rb") as f:
            value = tomllib.load(f).get("log", {}).get("format")
    except (OSError, tomllib.TOMLDecodeError):
        return None  # config.load reports the real error
    return str(value) if value is not None else None
