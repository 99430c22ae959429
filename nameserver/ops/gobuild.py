"""The project's Go programs, built from source on this machine: the node's gRPC front end (front/, [node]
grpc_front = "go") and the benchmarks' load generators (bench/loadgen, bench/gofront).

`build(source)` compiles the Go module at `source` into a cache directory outside the source tree
($XDG_CACHE_HOME or ~/.cache, rip18-loadgen/), keyed by its sources' hash: a change to any .go, go.mod or
go.sum builds a new binary, and an unchanged tree costs one hash of its files. Modules come from the Go
module proxy on the first build (then Go's module cache); go.mod and go.sum are read, never rewritten
(-mod=readonly). A `go` older than the module's go.mod asks for (Debian 12's golang-go is 1.19) builds with
the toolchain that go.mod names, fetched through the Go module proxy (toolchain()). `make setup` runs
`python -m nameserver.ops.gobuild`, so a clean clone has the front end built before a node needs it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

FRONT_SOURCE = Path(__file__).resolve().parents[2] / "front"  # the checkout's front/ beside nameserver/
CACHE_NAME = "rip18-loadgen"
KEEP_OLD_S = 7 * 86400  # other builds of a program older than this go; newer ones may be another checkout's
SWITCHES_ITSELF = (1, 21)  # the first go that fetches a newer toolchain itself (GOTOOLCHAIN)
Version = tuple[int, ...]


def go() -> str:
    found = shutil.which("go") or ("/usr/local/go/bin/go" if os.access("/usr/local/go/bin/go", os.X_OK) else None)
    if found is None:
        raise RuntimeError("`go` is not on PATH: install Go (make setup installs Debian's golang-go)")
    return found


def version_of(text: str) -> Version:
    """(1, 26, 0) of "go1.26.0", "1.26.0", "go1.19.8", "go1.22rc1" (a pre-release counts as its release)."""
    found = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", text)
    if found is None:
        raise RuntimeError(f"not a Go version: {text.strip()!r}")
    return tuple(int(part or 0) for part in found.groups())


def needed_version(source: Path) -> str:
    """The Go version the module's go.mod asks for ("1.26.0"): its `go` line."""
    found = re.search(r"^go\s+(\S+)\s*$", (source / "go.mod").read_text(), re.MULTILINE)
    return found.group(1) if found else "1.0"


def toolchain(source: Path) -> tuple[str, dict[str, str]]:
    """The go command to build `source` with, and what its environment adds: PATH's go when it is new
    enough; else the version go.mod asks for, which a go since 1.21 fetches itself (GOTOOLCHAIN) and an
    older one fetches through the Go module proxy as the module golang.org/toolchain."""
    found, needed = go(), needed_version(source)
    have = _go_env(found, "GOVERSION")[0]
    if version_of(have) >= version_of(needed):
        return found, {}
    if version_of(have) >= SWITCHES_ITSELF:
        return found, {"GOTOOLCHAIN": f"go{needed}"}
    goos, goarch = _go_env(found, "GOOS", "GOARCH")
    module = f"golang.org/toolchain@v0.0.1-go{needed}.{goos}-{goarch}"
    with tempfile.TemporaryDirectory() as outside:  # not in a module: go.mod's newer `go` line would stop it
        done = subprocess.run([found, "mod", "download", "-json", module], cwd=outside, capture_output=True,
                              text=True, timeout=600, env={**os.environ, "GO111MODULE": "on"})
    try:
        said = json.loads(done.stdout)
    except ValueError:
        said = {"Error": done.stderr.strip() or f"exit status {done.returncode}"}
    if done.returncode != 0 or "Dir" not in said:
        raise RuntimeError(f"{source.name}/ needs Go {needed} or newer; {found} is {have}, and fetching "
                           f"{module} through the Go module proxy failed: {said.get('Error', said)}")
    root = Path(said["Dir"])
    _make_executable(root)
    return str(root / "bin" / "go"), {"GOTOOLCHAIN": "local"}


def _go_env(found: str, *names: str) -> list[str]:
    done = subprocess.run([found, "env", *names], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "GOTOOLCHAIN": "local"})
    if done.returncode != 0:
        raise RuntimeError(f"`{found} env {' '.join(names)}` failed: {done.stderr.strip()}")
    return done.stdout.splitlines()


def _make_executable(root: Path) -> None:
    """A module zip keeps no file modes: the toolchain's programs are made executable, as go does when it
    fetches a toolchain itself."""
    for program in [*root.glob("bin/*"), *root.glob("pkg/tool/*/*")]:
        mode = program.stat().st_mode
        if program.is_file() and not mode & stat.S_IXUSR:
            program.chmod(mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def binary_path(source: Path = FRONT_SOURCE) -> Path:
    """Where the binary of the Go module at `source` is, once built: the cache, under its directory's name
    and its sources' hash."""
    digest = hashlib.sha256()
    for path in sorted(source.glob("*")):
        if path.suffix in (".go", ".mod", ".sum"):
            digest.update(path.name.encode() + b"\0" + path.read_bytes())
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / CACHE_NAME
    return cache / f"{source.name}-{digest.hexdigest()[:16]}"


def built(source: Path = FRONT_SOURCE) -> str | None:
    """The binary of the Go module at `source` if this version of its sources was built (make setup), else
    None (nothing is built: no Go toolchain, no network, no compile)."""
    if not (source / "go.mod").is_file():  # an installed package without the checkout's front/
        return None
    binary = binary_path(source)
    return str(binary) if os.access(binary, os.X_OK) else None


def build(source: Path = FRONT_SOURCE) -> str:
    """The binary of the Go module at `source`, built once per version of its sources, named after its
    directory."""
    name = source.name
    binary = binary_path(source)
    cache = binary.parent
    if not binary.exists():
        cache.mkdir(parents=True, exist_ok=True)
        tmp = cache / f".{name}-{os.getpid()}.tmp"
        command, env = toolchain(source)
        subprocess.run([command, "build", "-o", str(tmp), "."], cwd=source, check=True, timeout=600,
                       env={**os.environ, "GOFLAGS": "-mod=readonly", "CGO_ENABLED": "0", **env})
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
