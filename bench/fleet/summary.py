"""`python -m bench.fleet.summary REPORT.json ...`: one Markdown table row per simulator report (the rows of
docs/scaling.md, "Simulator runs")."""

from __future__ import annotations

import json
import sys
from typing import Any

COLUMNS = ("run", "fleet as run (represents)", "heartbeats/s offered / got", "routes/s offered / got",
           "heartbeat p50 / p99 ms", "route p50 / p99 ms", "changed registrations (p50 / p99 ms)",
           "CPU per node (cores)", "RSS max per node (MiB)", "Raft lag max", "leader changes",
           "expiry: all nodes after (bound)", "final check")
HEADER = "| " + " | ".join(COLUMNS) + " |\n" + "|---" * len(COLUMNS) + "|"


def row(r: dict[str, Any]) -> str:
    f, rep, ops, tot = r["fleet"], r["represents"], r["totals"]["ops"], r["totals"]
    run_s = r["simulation"]["seconds"]

    def got(op: str) -> str:
        return f"{ops.get(op, {}).get('count', 0) / run_s:,.0f}"

    def lat(op: str) -> str:
        o = ops.get(op, {})
        return f"{o.get('p50_ms', 0):,.1f} / {o.get('p99_ms', 0):,.1f}" + (f" ({o['errors']} errors)" if o.get("errors")
                                                                          else "")

    e = r.get("expiry") or {}
    expiry = (f"{e['all_nodes_s']} s ({e['bound_s']} s)" if e.get("all_nodes_s") is not None
              else f"not within the run ({e.get('bound_s')} s)" if e else "none")
    check = "; ".join(f"{c.get('silent_still_routed')} silent routed, {c.get('live_missing')} live missing"
                      for c in r["final_check"][:1])
    return (f"| {r['commit']} {r['date']} | {f['brokers']:,} brokers, {f['topics']:,} topics, {f['clients']:,} clients "
            f"x {f['topics_per_client']}, heartbeat {f['heartbeat_period_s']:g} s, poll {f['route_poll_period_s']:g} s "
            f"(x{r['time_scale']:g} of {rep['heartbeat_period_s']:g} s) "
            f"| {r['offered_per_s']['heartbeat']:,.0f} / {got('heartbeat')} | {r['offered_per_s']['route']:,.0f} / "
            f"{got('route')} | {lat('heartbeat')} | {lat('route')} | {ops.get('register_changed', {}).get('count', 0)} "
            f"({lat('register_changed')}) | "
            + ", ".join(f"{n['cpu_per_s']:.2f}" for n in tot["nodes"].values()) + " | "
            + ", ".join(f"{n['rss_max_bytes'] / 2**20:.0f}" for n in tot["nodes"].values()) + " | "
            + ", ".join(f"{k} {v}" for k, v in sorted(tot["raft_lag_max"].items()))
            + f" | {tot['leader_changes']} | {expiry} | {check} (first node) |")


def main(paths: list[str]) -> int:
    print(HEADER)
    for p in paths:
        with open(p) as fh:
            print(row(json.load(fh)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
