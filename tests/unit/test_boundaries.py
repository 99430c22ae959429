"""The import contracts ([tool.importlinter] in pyproject.toml) hold, and they can fail: the same check
on a copy of the tree with wrong-way imports (raftlog importing the nameserver, the core importing the API,
a raftlog module other than the shims importing pysyncobj) is refused. And what import-linter cannot see
(a package __init__ runs on every import of its modules): the client, the pure state and the pipeline load
no pysyncobj."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from tests.cluster import ROOT

PACKAGES = ("raftlog", "snapshot", "nameserver", "pipeline")
LINT_IMPORTS = str(Path(sys.executable).with_name("lint-imports"))


def _lint_imports(root: str | Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run([LINT_IMPORTS, "--no-cache"], cwd=root, env=env, capture_output=True, text=True,
                          timeout=120)


def test_the_tree_keeps_every_contract() -> None:
    res = _lint_imports(ROOT)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "0 broken" in res.stdout


def test_a_wrong_way_import_breaks_a_contract(tmp_path: Path) -> None:
    for pkg in PACKAGES:
        shutil.copytree(Path(ROOT) / pkg, tmp_path / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(Path(ROOT) / "pyproject.toml", tmp_path / "pyproject.toml")
    prevote = tmp_path / "raftlog" / "prevote.py"  # pysyncobj outside the shims
    prevote.write_text(prevote.read_text() + "\nimport pysyncobj  # noqa: E402,F401 (deliberately wrong)\n")
    digest = tmp_path / "raftlog" / "digest.py"
    digest.write_text(digest.read_text() + "\nimport nameserver.core.node  # noqa: E402,F401 (deliberately wrong)\n")
    readindex = tmp_path / "nameserver" / "core" / "readindex.py"  # the core reaching up into the API
    wrong = "\nimport nameserver.api.rpc  # noqa: E402,F401 (deliberately wrong)\n"
    readindex.write_text(readindex.read_text() + wrong)
    res = _lint_imports(tmp_path)
    assert res.returncode != 0, res.stdout
    assert "raftlog and snapshot know nothing of the nameserver or the pipeline BROKEN" in res.stdout
    assert "raftlog.digest -> nameserver.core.node" in res.stdout
    assert "the node's layers: each imports only the ones below it BROKEN" in res.stdout
    assert "nameserver.core.readindex -> nameserver.api.rpc" in res.stdout
    assert "only raftlog's pysyncobj shims import pysyncobj BROKEN" in res.stdout
    assert "raftlog.prevote -> pysyncobj" in res.stdout


def test_no_module_imports_itself_back() -> None:
    """No import cycle, not even through a function-level import (bench/echo <-> bench/workloads and
    pipeline/charts <-> pipeline/report were two): a cycle makes a module's import order matter."""
    import grimp

    graph = grimp.build_graph(*PACKAGES, "bench", cache_dir=None)
    cycles = sorted(f"{importer} -> {imported} -> ... -> {importer}" for importer in graph.modules
                    for imported in graph.find_modules_directly_imported_by(importer)
                    if graph.chain_exists(importer=imported, imported=importer))
    assert not cycles, cycles


# Every module of these packages (the pipeline's too: its jobs import from raftlog and nameserver).
PURE_PACKAGES = ("nameserver.client", "nameserver.state", "nameserver.logformat", "pipeline")


def test_the_client_the_pure_state_and_the_pipeline_load_no_pysyncobj() -> None:
    probe = f"""
import importlib, pkgutil, sys
for package in {PURE_PACKAGES!r}:
    names = [package] + [package + "." + m.name for m in pkgutil.iter_modules(importlib.import_module(package).__path__)
                         if m.name != "__main__"]
    for name in names:
        importlib.import_module(name)
        assert "pysyncobj" not in sys.modules, f"import {{name}} loaded pysyncobj"
"""
    res = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]


def test_importing_raftlog_patches_nothing_until_install() -> None:
    """The patching is the node's explicit step (raftlog.binding.install(), called by the first RaftNode)."""
    probe = """
import pysyncobj.syncobj, pysyncobj.transport
before = (pysyncobj.syncobj.createJournal, pysyncobj.transport.TcpConnection)
import raftlog.log
assert (pysyncobj.syncobj.createJournal, pysyncobj.transport.TcpConnection) == before, "patched at import"
raftlog.binding.install()
assert pysyncobj.syncobj.createJournal is raftlog.binding._create_journal
assert pysyncobj.transport.TcpConnection is raftlog.peerguard.GuardedTcpConnection
"""
    res = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert res.returncode == 0, res.stderr[-2000:]


def test_raftlog_refuses_a_pysyncobj_other_than_the_pinned_one() -> None:
    """raftlog/binding.py steers pysyncobj's private internals: pyproject pins the version it checks."""
    import tomllib

    from raftlog.binding import PYSYNCOBJ_VERSION

    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        deps = tomllib.load(f)["project"]["dependencies"]
    assert f"pysyncobj=={PYSYNCOBJ_VERSION}" in deps
    probe = ("import importlib.metadata as m; real = m.version; "
             "m.version = lambda name: '0.3.18' if name == 'pysyncobj' else real(name); "
             "import raftlog.binding; raftlog.binding.install()")
    res = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert res.returncode != 0 and f"pip install pysyncobj=={PYSYNCOBJ_VERSION}" in res.stderr, res.stderr[-2000:]
