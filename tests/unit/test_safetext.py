"""Escaping a client's text for logs and terminals (nameserver/safetext.py), the log formatters that
apply it to every record (nameserver/ops/logfmt.py), nsctl's escaped output (nameserver/cli/render.py)
and the once-per-interval log of repeated refusals (nameserver/logthrottle.py)."""

from __future__ import annotations

import io
import json
import logging
import sys

import pytest

from nameserver.cli import render
from nameserver.logthrottle import REPEAT_BURST, RepeatFilter, ThrottledLog, Windows
from nameserver.ops import logfmt
from nameserver.safetext import cut, escape_controls, escape_controls_in_lines, escape_for_json, shown

FORGED = "b1\n2026-01-01 00:00:00,000 CRITICAL nameserver: forged\r\x1b[2J\x1b]52;c;cHduZWQ=\x07\x9b31m\u2028\u202e"


def _unsafe(text: str) -> list[str]:
    """Characters a terminal or a line-oriented reader acts on (newlines aside, counted by the caller)."""
    return [c for c in text if ord(c) < 0x20 and c != "\n" or 0x7F <= ord(c) < 0xA0
            or c in "\u2028\u2029\u202e" or 0xD800 <= ord(c) < 0xE000]


# ---- the escaping functions ----------------------------------------------------------------------


def test_escape_controls_writes_every_control_as_repr_does() -> None:
    out = escape_controls(FORGED)
    assert "\n" not in out and not _unsafe(out)
    assert out.startswith("b1\\n2026-01-01") and "\\r\\x1b[2J\\x1b]52;c;cHduZWQ=\\x07\\x9b31m\\u2028\\u202e" in out
    assert escape_controls("plain name-1_a.b:10911 ünïcödé 名前") == "plain name-1_a.b:10911 ünïcödé 名前"
    assert escape_controls("a\\nb") == "a\\nb"  # backslashes left as they are
    assert escape_controls("\ud800") == "\\ud800"  # a lone surrogate, which a UTF-8 stream cannot write


def test_escape_controls_in_lines_keeps_newlines_and_tabs_only() -> None:
    assert escape_controls_in_lines("a\tb\nc\x1b[0m\r") == "a\tb\nc\\x1b[0m\\r"


def test_escape_for_json_leaves_json_that_parses_to_the_same_value() -> None:
    value = {"msg": FORGED + "\x7f\ud800"}
    text = escape_for_json(json.dumps(value, ensure_ascii=False))
    assert not _unsafe(text) and "\n" not in text
    assert json.loads(text) == value


def test_shown_escapes_backslashes_and_cuts_with_the_bytes_left_out() -> None:
    assert shown("broker-a") == "broker-a"
    assert shown("a\\n") == "a\\\\n"  # a literal backslash-n never reads as an escaped newline
    assert shown(b"\xffab\n") == "\\\\xffab\\n"
    long = "é" * 1000
    out = shown(long, limit=200)
    assert out == "é" * 200 + "...(1600 more bytes)"
    # the limit is on what is written: escapes count at their written length and are never split
    out = shown("\x1b" * 100, limit=10)
    assert out == "\\x1b\\x1b...(98 more bytes)"
    assert len(shown("\n" * 10_000_000)) < 250  # a huge value costs a bounded line


def test_cut_without_escaping_only_bounds_the_length() -> None:
    assert cut("abcdef", 3, {}) == "abc...(3 more bytes)"
    assert cut("abc", 3, {}) == "abc"


# ---- the log formatters --------------------------------------------------------------------------


def _log_through(fmt: str, emit: object) -> str:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logfmt.make_formatter(fmt))
    logger = logging.getLogger(f"test.safetext.{fmt}")
    logger.propagate = False
    logger.addHandler(handler)
    try:
        assert callable(emit)
        emit(logger)
    finally:
        logger.removeHandler(handler)
    return stream.getvalue()


def _forged_everywhere(logger: logging.Logger) -> None:
    logger.warning("remoting: broker %s registered %d topic(s)", FORGED, 2, extra={"broker": FORGED})
    try:
        raise ValueError(f"bad name {FORGED}")
    except ValueError:
        logger.exception("failed for %s", FORGED)


def test_text_format_writes_one_line_per_record_whatever_the_args_hold() -> None:
    out = _log_through("text", _forged_everywhere)
    assert not _unsafe(out)
    lines = out.splitlines()
    # every line at column 0 is a record; the traceback's lines are indented
    records = [line for line in lines if not line.startswith(" ")]
    assert len(records) == 2 and all(" WARNING " in r or " ERROR " in r for r in records)
    assert not any(line.startswith("2026-01-01") for line in lines)
    assert "  Traceback (most recent call last):" in out and "\n  ValueError: bad name b1\n  2026-01-01" in out


def test_json_format_writes_one_object_per_record_whatever_the_args_hold() -> None:
    out = _log_through("json", _forged_everywhere)
    assert not _unsafe(out)
    docs = [json.loads(line) for line in out.splitlines()]
    assert len(docs) == 2
    assert docs[0]["msg"] == f"remoting: broker {FORGED} registered 2 topic(s)" and docs[0]["broker"] == FORGED


def test_a_message_is_cut_at_the_maximum() -> None:
    out = _log_through("text", lambda logger: logger.warning("%s", "x" * (logfmt.MAX_MESSAGE_CHARS * 2)))
    assert len(out) < logfmt.MAX_MESSAGE_CHARS + 100 and "more bytes)" in out


# ---- nsctl's output ------------------------------------------------------------------------------


def test_a_table_cell_cannot_forge_a_row() -> None:
    text = render.table(("KEY", "VALUE"), [["k1", "v1\nforged-key  forged-value"], ["\x1b]0;pwned\x07", "v2"]])
    lines = text.splitlines()
    assert len(lines) == 3 and not _unsafe(text)
    assert not any(line.startswith("forged-key") for line in lines)


def test_escaped_output_lets_no_control_character_through(capsys: pytest.CaptureFixture[str]) -> None:
    with render.escaped_output():
        print("line one\n\x1b[31mred\x9b\x07")
        print("err \x1b]52;c;x\x07", file=sys.stderr)
    out, err = capsys.readouterr()
    assert out == "line one\n\\x1b[31mred\\x9b\\x07\n" and err == "err \\x1b]52;c;x\\x07\n"
    print("\x1b")  # restored afterwards
    assert capsys.readouterr().out == "\x1b\n"


# ---- the throttled log ---------------------------------------------------------------------------


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_throttled_log_writes_once_per_interval_with_the_count_left_out(caplog: pytest.LogCaptureFixture) -> None:
    clock = _Clock()
    throttled = ThrottledLog(logging.getLogger("test.throttle"), interval_s=10, clock=clock)
    caplog.set_level(logging.INFO, logger="test.throttle")
    assert throttled.warning("bad_frame", "refused %s", "a")
    for i in range(500):
        assert not throttled.warning("bad_frame", "refused %s", i)
    assert throttled.info("other_kind", "another kind is not held back")
    clock.now += 10
    assert throttled.warning("bad_frame", "refused %s", "b")
    assert [(r.getMessage(), getattr(r, "suppressed", 0)) for r in caplog.records] == [
        ("refused a", 0), ("another kind is not held back", 0), ("refused b", 500)]
    assert caplog.records[0].funcName == "test_throttled_log_writes_once_per_interval_with_the_count_left_out"


def test_throttled_log_counts_nothing_below_the_loggers_level() -> None:
    logger = logging.getLogger("test.throttle.quiet")
    logger.setLevel(logging.ERROR)
    throttled = ThrottledLog(logger, interval_s=10, clock=_Clock())
    assert not throttled.info("kind", "x")
    assert throttled.windows._kinds == {}


def _record(name: str, msg: str, *args: object, level: int = logging.WARNING, **extra: object) -> logging.LogRecord:
    record = logging.LogRecord(name, level, __file__, 1, msg, args, None)
    record.__dict__.update(extra)
    return record


def test_repeat_filter_holds_back_a_template_past_its_burst_and_counts() -> None:
    clock = _Clock()
    f = RepeatFilter(burst=3, interval_s=10, clock=clock)
    passed = [f.filter(_record("nameserver.remoting", "closing connection from %s: %s", f"10.0.0.{i}", "bad"))
              for i in range(100)]
    assert passed == [True] * 3 + [False] * 97
    assert f.filter(_record("nameserver.remoting", "another template"))  # counted apart
    assert f.filter(_record("raftlog", "closing connection from %s: %s", "x", "y"))  # another logger: apart
    # operators' events and critical lines are never held back
    assert all(f.filter(_record("nameserver.core.node", "expired broker %s", i, event="broker_expired"))
               for i in range(50))
    assert all(f.filter(_record("x", "journal failed", level=logging.CRITICAL)) for _ in range(50))
    clock.now += 10
    record = _record("nameserver.remoting", "closing connection from %s: %s", "10.0.0.200", "bad")
    assert f.filter(record) and record.suppressed == 97


def test_repeat_filter_bounds_its_table_of_kinds() -> None:
    """Templates a caller chooses (an f-string message) cannot grow the filter's memory."""
    clock = _Clock()
    windows = Windows(burst=1, interval_s=10, clock=clock, max_kinds=50)
    for i in range(10_000):
        windows.admit(f"client text {i}")
    assert len(windows._kinds) <= 51
    clock.now += 10
    assert windows.admit("new kind after the quiet ones expired") == 0


def test_the_node_log_handler_holds_back_repeats() -> None:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    stream = io.StringIO()
    logfmt.configure("text", stream=stream)
    try:
        logger = logging.getLogger("test.safetext.flood")
        for i in range(1000):
            logger.warning("remoting: closing connection from %s: bad frame", f"10.0.0.{i}")
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
    assert len(stream.getvalue().splitlines()) == REPEAT_BURST
