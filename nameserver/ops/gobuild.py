"""The project's Go programs, built from source on this machine: the node's gRPC front end (front/, [node]
grpc_front = "go") and the benchmarks' load generators (bench/loadgen, bench/gofront).

`build(source)` compiles the Go module at `source` into a cache directory outside the source tree
($XDG_CACHE_HOME or ~/.cache, rip18-loadgen/), keyed by its sources' hash: a change to any .go, go.mod or
go.sum builds a new binary, and an unchanged tree costs one hash of its files. Modules come from the Go
module proxy on the first build (then Go's module cache). `make setup` runs `python -m nameserver.ops.gobuild`,
so a clean clone has the front end built before a node needs it.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

FRONT_SOURCE = Path(__file__).resolve().parents[2] / "front"  # the checkout's front/ beside nameserver/
CACHE_NAME = "rip18-loadgen"
KEEP_OLD_S = 7 * 86400  # other builds of a program older than this go; newer ones may be another checkout's


def go() -> str:
    found = shutil.which("go") or ("/usr/local/go/bin/go" if os.access("/usr/local/go/bin/go", os.X_OK) else None)
    if found is None:
        raise RuntimeError("`go` is not on PATH: install Go (make setup installs Debian's golang-go)")
    return found


def build(source: Path = FRONT_SOURCE) -> str:
    """The binary of the Go module at `source`, built once per version of its sources, named after its
    directory."""
    name = source.name
    digest = hashlib.sha256()
    for path in sorted(source.glob("*")):
        if path.suffix in (".go", ".mod", ".sum"):
            digest.update(path.name.encode() + b"\0" + path.read_bytes())
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / CACHE_NAME
    binary = cache / f"{name}-{digest.hexdigest()[:16]}"
    if not binary.exists():
        cache.mkdir(parents=True, exist_ok=True)
        tmp = cache / f".{name}-{os.getpid()}.tmp"
        subprocess.run([go(), "build", "-o", str(tmp), "."], cwd=source, check=True, timeout=600,
                       env={**os.environ, "GOFLAGS": "-mod=mod", "CGO_ENABLED": "0"})
        tmp.rename(binary)  # atomic: a concurrent build of the same sources ends with the same file
        for old in cache.glob(f"{name}-*"):
            if old != binary and time.time() - old.stat().st_mtime > KEEP_OLD_S:
                old.unlink(missing_ok=True)
    return str(binary)


def main() -> int:
    try:
        print(f"front end: {build()}")
    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
        print(f"nameserver.ops.gobuild: the Go front end was not built: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
