"""`nsctl plan`: the capacity model (nameserver/ops/capacity.py, docs/scaling.md) from the command line.

    nsctl plan --fleet fleet.toml --costs costs.json [--json]

The fleet file (TOML, or JSON when its name ends in .json) holds the fields of capacity.Fleet; the costs
file is what `python -m bench --only costs` wrote (make costs). Nothing is asked of a cluster: the plan
is the model's projection from measured per-operation costs.
"""

from __future__ import annotations

import argparse
import json
import tomllib
from typing import Any

from nameserver.cli.nsctl_calls import Context, UsageError, emit_json
from nameserver.ops.capacity import Fleet, PlanError, plan, read_costs, render


def _load(path: str, what: str) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            data = json.load(f) if path.endswith(".json") else tomllib.load(f)
    except (OSError, ValueError) as exc:  # tomllib.TOMLDecodeError and json's errors are ValueErrors
        raise UsageError(f"--{what} {path}: {exc}") from None
    if not isinstance(data, dict):
        raise UsageError(f"--{what} {path}: not a table of fields")
    return data


def cmd_plan(ctx: Context, args: argparse.Namespace) -> int:
    try:
        fleet = Fleet.from_dict(_load(args.fleet, "fleet"))
        result = plan(fleet, read_costs(_load(args.costs, "costs")))
    except PlanError as exc:
        raise UsageError(str(exc)) from None
    if ctx.json:
        emit_json({"fleet": vars(fleet), **result.to_dict()})
    else:
        print(render(result, fleet, args.costs), end="")
    return 0


def add_plan_command(builder: Any, sub: Any) -> None:
    """Register `nsctl plan` on nsctl's parser (builder: nsctl's _Builder)."""
    p = builder.command(sub, "plan", cmd_plan,
                        "what a fleet needs (nodes, workers, read replicas, shards, memory, network) from measured "
                        "costs, with the arithmetic")
    p.add_argument("--fleet", required=True, help="fleet description (TOML, or JSON if it ends in .json)")
    p.add_argument("--costs", required=True, help="costs file written by python -m bench --only costs")
