"""Shared start-up for the atheris targets: import path and the fuzzer loop."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
if str(ROOT) not in sys.path:  # run as a script: make the repository importable
    sys.path.insert(0, str(ROOT))

INSTRUMENTED = ["nameserver", "raftlog", "snapshot"]  # coverage feedback from our code only


def run(test_one_input: Callable[[bytes], None]) -> None:
    import atheris

    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()
