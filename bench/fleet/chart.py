"""The report's chart over time (SVG, matplotlib) and an HTML page holding it with the run's summary."""

from __future__ import annotations

import html
import io
import json
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def svg(report: dict[str, Any]) -> str:
    """Five panels over the run's windows: ops/s and p99 per operation, CPU and RSS per node, Raft lag per
    follower; the mass expiry marked where it began and where its routes were gone everywhere, and each
    change of leader."""
    wins = report["windows"]
    width = report["simulation"]["window_s"]
    t = [w["t_s"] + width for w in wins]
    ops = sorted({op for w in wins for op in w["ops"]})
    nodes = sorted({n for w in wins for n in w.get("nodes", {})})
    followers = sorted({n for w in wins for n in w.get("raft_lag", {})})
    fig, axes = plt.subplots(5, 1, figsize=(11, 14), sharex=True)
    panels = [
        ("operations / s", [(op, [w["ops"].get(op, {}).get("count", 0) / width for w in wins]) for op in ops]),
        ("p99 latency (ms)", [(op, [w["ops"].get(op, {}).get("p99_ms", 0) for w in wins]) for op in ops]),
        ("CPU (cores)", [(n, [w.get("nodes", {}).get(n, {}).get("cpu_s", 0) / width for w in wins]) for n in nodes]),
        ("RSS (MiB)", [(n, [w.get("nodes", {}).get(n, {}).get("rss_bytes", 0) / 2**20 for w in wins]) for n in nodes]),
        ("Raft lag (entries)", [(n, [w.get("raft_lag", {}).get(n, 0) for w in wins]) for n in followers]),
    ]
    expiry = report.get("expiry") or {}
    leaders = [(w["t_s"] + width, w.get("leader", "")) for w in wins]
    moves = [t for (_, a), (t, b) in zip(leaders, leaders[1:], strict=False) if a and b and a != b]
    for ax, (title, series) in zip(axes, panels, strict=True):
        for t_move in moves:  # the leader changed within the window ending here
            ax.axvline(t_move, color="#7f7f7f", linewidth=3, alpha=0.3)
        for label, ys in series:
            ax.plot(t, ys, label=label, marker=".")
        ax.set_ylabel(title)
        ax.grid(alpha=0.3)
        if series:
            ax.legend(fontsize=8, loc="upper left")
        if "at_s" in expiry:
            ax.axvline(expiry["at_s"], color="#d62728", linestyle="--")
            if expiry.get("all_nodes_s") is not None:
                ax.axvline(expiry["at_s"] + expiry["all_nodes_s"], color="#d62728", linestyle=":")
    axes[-1].set_xlabel("seconds into the run (end of each window); red: mass expiry begins / routes gone everywhere; "
                        "grey: the leader changed")
    f = report["fleet"]
    fig.suptitle(f"fleet: {f['brokers']} brokers, {f['topics']} topics, {f['clients']} clients, "
                 f"time x{report['time_scale']:g} ({report['commit']}, {report['date']})")
    buf = io.StringIO()
    fig.tight_layout()
    fig.savefig(buf, format="svg")
    plt.close(fig)
    return buf.getvalue()


def page(report: dict[str, Any], chart: str) -> str:
    """The HTML page: the chart inline, then the fleet, the totals and the expiry as JSON."""
    summary = {k: report[k] for k in ("fleet", "represents", "time_scale", "setup", "expiry", "final_check")}
    summary["totals"] = report["totals"]
    return ("<!doctype html><meta charset='utf-8'><title>Fleet simulation</title>"
            f"<h1>Fleet simulation ({html.escape(report['commit'])}, {html.escape(report['date'])})</h1>"
            f"{chart[chart.index('<svg'):]}"
            f"<pre>{html.escape(json.dumps(summary, indent=1), quote=False)}</pre>")


__all__ = ["page", "svg"]
