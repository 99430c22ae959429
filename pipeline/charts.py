"""The report's charts (matplotlib, PNG) and its one HTML page (the PNGs inline, plus files beside it)."""

from __future__ import annotations

import base64
import datetime as dt
import html
import io
from collections.abc import Callable
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
from pyspark.sql import SparkSession  # noqa: E402

from pipeline.session import join, write_bytes, write_text  # noqa: E402

Figure = Any
_REASON_COLORS = {"expired": "#d62728", "unregistered": "#1f77b4", "unknown": "#7f7f7f", "open": "#2ca02c"}


def _png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    return buf.getvalue()


def _empty(ax: Any, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="#666")
    ax.set_xticks([])
    ax.set_yticks([])


def records_per_minute(df: pd.DataFrame) -> bytes:
    fig, ax = plt.subplots(figsize=(11, 4))
    if df.empty:
        _empty(ax, "no records")
    else:
        wide = df.pivot_table(index="minute_ms", columns="type_name", values="records", aggfunc="sum").fillna(0)
        wide.index = pd.to_datetime(wide.index, unit="ms", utc=True)
        per_hour = wide.resample("1h").sum() if len(wide) > 2000 else wide
        per_hour.plot.area(ax=ax, linewidth=0, alpha=0.85)
        ax.set_ylabel("records / hour" if per_hour is not wide else "records / minute")
        ax.set_xlabel("leader clock (UTC)")
        ax.legend(loc="upper left", fontsize=8, ncol=4)
    ax.set_title("Records written, by type")
    return _png(fig)


def bytes_per_type(df: pd.DataFrame) -> bytes:
    fig, ax = plt.subplots(figsize=(7, 3.5))
    if df.empty:
        _empty(ax, "no records")
    else:
        d = df.sort_values("bytes")
        ax.barh(d["type_name"], d["bytes"] / 1e6, color="#4c72b0")
        for y, (mb, n) in enumerate(zip(d["bytes"] / 1e6, d["records"], strict=True)):
            ax.text(mb, y, f" {n:,} records", va="center", fontsize=8)
        ax.set_xlabel("MB (keys + values)")
    ax.set_title("Log volume by record type")
    return _png(fig)


def session_durations(rows: list[dict[str, Any]], edges_s: tuple[int, ...]) -> bytes:
    fig, ax = plt.subplots(figsize=(9, 3.8))
    if not rows:
        _empty(ax, "no broker session ended")
    else:
        labels = [_human(e) + "+" for e in edges_s]
        df = pd.DataFrame(rows).pivot_table(index="bucket", columns="end_reason", values="count",
                                            aggfunc="sum").reindex(range(len(edges_s))).fillna(0)
        bottom = [0.0] * len(df)
        for reason in df.columns:
            ax.bar(range(len(df)), df[reason], bottom=bottom, label=reason,
                   color=_REASON_COLORS.get(reason, "#999"))
            bottom = [b + v for b, v in zip(bottom, df[reason], strict=True)]
        ax.set_xticks(range(len(df)), labels, rotation=45, fontsize=8)
        ax.set_ylabel("sessions")
        ax.legend(fontsize=8)
    ax.set_title("How long broker sessions lasted (registration to expiry or unregister)")
    return _png(fig)


def flapping(df: pd.DataFrame, flap_ends: int) -> bytes:
    fig, ax = plt.subplots(figsize=(9, 4))
    if df.empty:
        _empty(ax, "no broker sessions")
    else:
        d = df.iloc[::-1]
        colors = ["#d62728" if f else "#9ecae1" for f in d["flapping"]]
        ax.barh(d["addr"] + "  " + d["broker_name"].fillna(""), d["max_ends_in_window"], color=colors)
        ax.axvline(flap_ends - 0.5, color="#d62728", linestyle="--", linewidth=1)
        ax.set_xlabel("most session ends within the flap window (red: flapping)")
        ax.tick_params(axis="y", labelsize=7)
    ax.set_title("Brokers that come and go")
    return _png(fig)


def topic_churn(df: pd.DataFrame) -> bytes:
    fig, ax = plt.subplots(figsize=(8, 3.8))
    if df.empty:
        _empty(ax, "no topic queue data")
    else:
        x = range(len(df))
        ax.bar([i - 0.2 for i in x], df["creations"], width=0.4, label="created", color="#2ca02c")
        ax.bar([i + 0.2 for i in x], df["deletions"], width=0.4, label="deleted", color="#d62728")
        ax.set_xticks(list(x), df["cluster"], rotation=30, fontsize=8)
        ax.set_ylabel("topics")
        ax.legend(fontsize=8)
    ax.set_title("Topic creations and deletions per cluster")
    return _png(fig)


def hot_keys(df: pd.DataFrame) -> bytes:
    fig, ax = plt.subplots(figsize=(9, 4.5))
    if df.empty:
        _empty(ax, "no records")
    else:
        d = df.iloc[::-1]
        ax.barh(d["key"], d["writes"], color="#8172b2")
        ax.set_xlabel("writes")
        ax.tick_params(axis="y", labelsize=7)
    ax.set_title("Most written keys")
    return _png(fig)


def _human(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:g} {unit}"
    return f"{seconds:g} s"


def _time(ms: int | None) -> str:
    if ms is None:
        return "-"
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _table(df: pd.DataFrame, columns: list[str]) -> str:
    if df.empty:
        return "<p><i>none</i></p>"
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(row[c]))}</td>" for c in columns) + "</tr>"
                   for _, row in df[columns].iterrows())
    return f"<table><tr>{head}</tr>{body}</table>"


_CSS = ("body{font-family:sans-serif;max-width:1150px;margin:2em auto;color:#222}"
        "table{border-collapse:collapse;font-size:13px;margin:.5em 0 1.5em}"
        "td,th{border:1px solid #ccc;padding:3px 8px;text-align:left}th{background:#f3f3f3}"
        "img{max-width:100%;border:1px solid #eee;margin:.3em 0}p.q{color:#555;margin:.2em 0}")


def write_report(spark: SparkSession, out: str, summary: dict[str, Any], data: dict[str, Any]) -> str:
    flap_ends = int(summary["flap_rule"].split()[1])
    charts: list[tuple[str, str, Callable[[], bytes]]] = [
        ("records_per_minute", "When is the log written, and by what?",
         lambda: records_per_minute(data["per_minute"])),
        ("bytes_per_type", "Which record types make the log big?", lambda: bytes_per_type(data["per_type"])),
        ("session_durations", "How long do brokers stay registered, and how do sessions end?",
         lambda: session_durations(data["durations"], data["duration_buckets_s"])),
        ("flapping", "Which brokers flap?", lambda: flapping(data["brokers"], flap_ends)),
        ("topic_churn", "How much do topics churn, per cluster?", lambda: topic_churn(data["churn"])),
        ("hot_keys", "Which keys are written most?", lambda: hot_keys(data["hot_keys"])),
    ]
    parts = [f"<html><head><meta charset='utf-8'><title>Metadata log report</title><style>{_CSS}</style>"
             "</head><body><h1>Metadata log report</h1>",
             _table(pd.DataFrame([
                 ("log", summary["log"]), ("offsets", f"{summary['first_offset']}..{summary['last_offset']}"),
                 ("entries / records", f"{summary['entries']:,} / {summary['records']:,}"),
                 ("batches whose preconditions failed", summary["failed_batches"]),
                 ("leader terms", summary["terms"]), ("keys written", f"{summary['keys_written']:,}"),
                 ("leader clock", f"{_time(summary['first_time_ms'])} .. {_time(summary['last_time_ms'])}"),
                 ("broker sessions", summary["sessions"]),
                 ("flapping brokers", f"{summary['flapping_brokers']} ({summary['flap_rule']})"),
             ], columns=["what", "value"]), ["what", "value"])]
    for name, question, draw in charts:
        png = draw()
        write_bytes(spark, join(out, "charts", f"{name}.png"), png)
        parts.append(f"<h2>{html.escape(question)}</h2><img alt='{name}' src='data:image/png;base64,"
                     f"{base64.b64encode(png).decode()}'><p class='q'>charts/{name}.png</p>")
        if name == "flapping":
            parts.append(_table(data["brokers"], ["addr", "broker_name", "cluster", "sessions", "expiries",
                                                  "unregisters", "max_ends_in_window", "flapping"]))
        elif name == "topic_churn":
            parts.append(_table(data["churn"], ["cluster", "creations", "deletions", "topics_at_end"]))
        elif name == "hot_keys":
            parts.append(_table(data["hot_keys"], ["key", "type_name", "writes", "bytes"]))
    parts.append("<p class='q'>Tables: tables/*/ (Parquet). Generated by <code>python -m pipeline report</code>."
                 "</p></body></html>")
    uri = join(out, "report.html")
    write_text(spark, uri, "\n".join(parts))
    return uri
