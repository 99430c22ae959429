"""Each atheris target runs for a bounded time (FUZZ_SECONDS, default 6) on a copy of its corpus.

The three targets run side by side. A target passes when it exits 0 and leaves no crash, timeout, OOM
or leak artifact. New corpus entries go to the temporary copy: the repository's corpus only changes
when someone runs tests/fuzz/make_corpus.py (or copies in an interesting input on purpose).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
TARGETS = sorted(p.stem for p in (HERE / "atheris_targets").glob("*.py") if not p.name.startswith("_"))
SECONDS = int(os.environ.get("FUZZ_SECONDS", "6"))
# A fixed seed by default, so CI explores the same inputs every run (a failure reproduces);
# FUZZ_SEED=0 lets libFuzzer pick one (the long runs in docs/fuzzing.md).
SEED = int(os.environ.get("FUZZ_SEED", "1"))
ARTIFACTS = ("crash-", "timeout-", "oom-", "leak-", "slow-unit-")


def test_every_target_has_a_corpus() -> None:
    assert TARGETS == ["grpc_requests", "register_body", "remoting_frame"]
    total = 0
    for target in TARGETS:
        files = list((HERE / "corpus" / target).iterdir())
        assert 10 <= len(files) <= 100, f"{target}: {len(files)} seed files"
        total += sum(f.stat().st_size for f in files)
    assert total < 1 << 20, "the committed corpora must stay under 1 MiB"


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[int, str, list[str]]]:
    """Start every target at once, wait for all: target -> (exit code, output tail, artifacts)."""
    procs = {}
    for target in TARGETS:
        work = tmp_path_factory.mktemp(target)
        corpus = work / "corpus"
        shutil.copytree(HERE / "corpus" / target, corpus)
        log = open(work / "fuzz.log", "wb")  # noqa: SIM115 - closed below, after the process ends
        cmd = [sys.executable, str(HERE / "atheris_targets" / f"{target}.py"), f"-max_total_time={SECONDS}",
               "-timeout=60", "-rss_limit_mb=2048", *([f"-seed={SEED}"] if SEED else []),
               f"-artifact_prefix={work}/", "-print_final_stats=1",
               str(corpus)]
        procs[target] = (subprocess.Popen(cmd, cwd=work, stdout=log, stderr=subprocess.STDOUT), work, log)
    out = {}
    deadline = time.monotonic() + SECONDS + 300  # a loaded CI machine starts Python slowly
    for target, (proc, work, log) in procs.items():
        try:
            rc = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = proc.wait()
        log.close()
        text = (work / "fuzz.log").read_text(errors="replace")
        artifacts = [p.name for p in work.iterdir() if p.name.startswith(ARTIFACTS)]
        out[target] = (rc, text[-4000:], artifacts)
    return out


@pytest.mark.parametrize("target", TARGETS)
def test_target_runs_clean(runs: dict[str, tuple[int, str, list[str]]], target: str) -> None:
    rc, tail, artifacts = runs[target]
    assert rc == 0 and not artifacts, f"{target} exited {rc}, artifacts {artifacts}:\n{tail}"
    assert "Done " in tail, f"{target} did not finish its run:\n{tail}"
