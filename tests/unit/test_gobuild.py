"""Building the Go front end where PATH's `go` is older than front/go.mod asks for (Debian 12's golang-go is
1.19): nameserver/ops/gobuild.py picks the toolchain go.mod names. An old go is stood in for by a script on
PATH that says its version, logs what it was asked, and answers the module proxy's toolchain download with a
directory whose bin/go is this machine's real go; the build itself is real (a one-file module)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from nameserver.ops import gobuild

REAL_GO = gobuild.go()
GO_CACHE = subprocess.run([REAL_GO, "env", "GOCACHE"], capture_output=True, text=True, check=True).stdout.strip()


def _module(root: Path) -> Path:
    source = root / "hello"
    source.mkdir()
    (source / "go.mod").write_text("module hello\n\ngo 1.26.0\n")
    (source / "main.go").write_text('package main\n\nimport "fmt"\n\nfunc main() { fmt.Println("hello") }\n')
    return source


def _old_go(root: Path, version: str, download: str) -> Path:
    """A `go` that says it is `version`; `mod download` prints `download`; anything else runs the real go."""
    bin_dir = root / "oldgo"
    bin_dir.mkdir()
    log = root / "asked"
    script = bin_dir / "go"
    script.write_text(f"""#!/bin/sh
echo "$* GOTOOLCHAIN=$GOTOOLCHAIN GOFLAGS=$GOFLAGS" >> {log}
case "$1 $2" in
  "env GOVERSION") echo {version} ;;
  "env GOOS") printf 'linux\\namd64\\n' ;;
  "mod download") printf '%s\\n' '{download}'; case '{download}' in *Error*) exit 1 ;; esac ;;
  *) GOTOOLCHAIN=local exec {REAL_GO} "$@" ;;
esac
""")
    script.chmod(0o755)
    return log


@pytest.fixture
def old_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("PATH", f"{tmp_path / 'oldgo'}:{os.environ['PATH']}")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("GOCACHE", GO_CACHE)  # Go's own build cache stays the machine's (a cold one: seconds)
    return tmp_path


def test_versions_are_read_as_go_writes_them(tmp_path: Path) -> None:
    assert gobuild.version_of("go1.19.8") == (1, 19, 8) < gobuild.version_of("1.26.0") == (1, 26, 0)
    assert gobuild.version_of("go1.22rc1") == (1, 22, 0)
    assert gobuild.needed_version(_module(tmp_path)) == "1.26.0"


def test_a_go_before_1_21_builds_with_the_toolchain_fetched_through_the_module_proxy(old_path: Path) -> None:
    toolchain = old_path / "modcache" / "golang.org" / "toolchain@v0.0.1-go1.26.0.linux-amd64"
    (toolchain / "bin").mkdir(parents=True)
    (toolchain / "bin" / "go").symlink_to(REAL_GO)
    log = _old_go(old_path, "go1.19.8", json.dumps({"Dir": str(toolchain)}))
    binary = gobuild.build(_module(old_path))
    assert subprocess.run([binary], capture_output=True, text=True, check=True).stdout == "hello\n"
    asked = log.read_text()
    assert "mod download -json golang.org/toolchain@v0.0.1-go1.26.0.linux-amd64" in asked
    assert "build" not in asked  # the fetched go built it, not the old one


def test_a_go_since_1_21_is_told_the_toolchain_to_fetch(old_path: Path) -> None:
    log = _old_go(old_path, "go1.22.0", "")
    gobuild.build(_module(old_path))
    assert "build -o" in (asked := log.read_text())
    assert "GOTOOLCHAIN=go1.26.0 GOFLAGS=-mod=readonly" in asked.split("build -o")[1], asked


def test_a_toolchain_that_cannot_be_fetched_names_the_version_needed(old_path: Path) -> None:
    _old_go(old_path, "go1.19.8", json.dumps({"Error": "proxy.golang.org: no route to host"}))
    with pytest.raises(RuntimeError, match=r"hello/ needs Go 1\.26\.0 or newer; .* is go1\.19\.8.*no route to host"):
        gobuild.build(_module(old_path))


def test_the_build_leaves_go_mod_and_go_sum_as_they_are(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """-mod=readonly: a build that would have to change go.mod fails instead of rewriting the checkout's."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("GOCACHE", GO_CACHE)
    source = _module(tmp_path)
    (source / "main.go").write_text('package main\n\nimport "golang.org/x/sys/unix"\n\n'
                                    'func main() { _ = unix.Getpid() }\n')
    before = (source / "go.mod").read_text()
    with pytest.raises(subprocess.CalledProcessError):
        gobuild.build(source)
    assert (source / "go.mod").read_text() == before
    assert not (source / "go.sum").exists()
    shutil.rmtree(source)
