"""Our histories checked by porcupine (Go), the checker etcd's robustness tests use: a cross-check of
tests/linearizability/checker.py, so that a bug in our checker cannot hide the bugs it is meant to find.

`build()` compiles tests/linearizability/porcupine/ (porcupine comes from the Go module proxy) into a
cache directory keyed by the sources' hash; `check_with_porcupine(histories)` returns "ok", "illegal" or
"unknown" (porcupine's time ran out) per history.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

from tests.linearizability.checker import INF, Op

SOURCE = Path(__file__).with_name("porcupine")
NS = 1_000_000_000


def bound_unknowns(ops: list[Op]) -> list[Op]:
    """The history with each unknown outcome bounded as the model allows, so porcupine's search does not
    carry hundreds of operations pending to the end of time (a full-disk run has ~1,000):

    - an unknown read has no effect anywhere: left out;
    - an unknown compare-and-set expecting version V > 0 can only take effect while the binding is at V,
      and versions are unique log offsets that only grow, so never after an operation that observed a
      newer version has completed: its return is moved to the first such completion, and one invoked
      after that can never apply: left out (our checker retires these the same way).
    A must-not-exist bind (expected 0) is left pending: a binding can be unbound again."""
    newer_seen: dict[str, list[tuple[float, int]]] = {}
    for o in ops:
        if o.status == "ok" and (o.kind == "bind" or (o.kind == "read" and o.found)):
            newer_seen.setdefault(o.key, []).append((o.complete, o.version))
    out = []
    for o in ops:
        if o.status == "unknown" and o.kind == "read":
            continue
        if o.status == "unknown" and o.expected > 0:
            ends = [t for t, v in newer_seen.get(o.key, ()) if v > o.expected]
            if ends:
                end = min(ends)
                if end < o.invoke:
                    continue
                o = replace(o, complete=end)
        out.append(o)
    return out


def export(ops: list[Op]) -> list[dict]:
    """One history in porcupinecheck's JSON form (times in integer nanoseconds)."""
    return [{"process": o.process, "key": o.key, "kind": o.kind, "invoke": round(o.invoke * NS),
             "complete": None if o.complete == INF else round(o.complete * NS), "status": o.status,
             "owner": o.owner, "expected": o.expected, "version": o.version, "found": o.found}
            for o in bound_unknowns(ops)]


def build() -> str:
    """The checker's binary, built once per source version."""
    go = shutil.which("go")
    if go is None:
        raise RuntimeError("porcupine cross-check: `go` is not on PATH (the Go toolchain builds the checker)")
    digest = hashlib.sha256()
    for name in ("go.mod", "go.sum", "main.go"):
        digest.update((SOURCE / name).read_bytes())
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "rip18-porcupine"
    binary = cache / f"porcupinecheck-{digest.hexdigest()[:16]}"
    if not binary.exists():
        cache.mkdir(parents=True, exist_ok=True)
        tmp = binary.with_suffix(".tmp")
        subprocess.run([go, "build", "-o", str(tmp), "."], cwd=SOURCE, check=True, timeout=600,
                       env={**os.environ, "GOFLAGS": "-mod=mod"})
        tmp.rename(binary)
        for old in cache.glob("porcupinecheck-*"):  # builds of earlier sources
            if old != binary:
                old.unlink(missing_ok=True)
    return str(binary)


def check_with_porcupine(histories: list[list[Op]], timeout_s: float = 10.0) -> list[str]:
    binary = build()
    res = subprocess.run([binary], input=json.dumps([export(h) for h in histories]), capture_output=True,
                         text=True, timeout=60 + timeout_s * len(histories),
                         env={**os.environ, "PORCUPINE_TIMEOUT_S": str(timeout_s)})
    if res.returncode != 0:
        raise RuntimeError(f"porcupinecheck failed ({res.returncode}): {res.stderr.strip()}")
    results = [json.loads(line) for line in res.stdout.splitlines()]
    assert [r["index"] for r in results] == list(range(len(histories))), res.stdout
    return [r["result"] for r in results]
