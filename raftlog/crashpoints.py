"""Named points where a test may kill this process, to prove recovery from a crash at that instant.

    RIP18_CRASH_POINT=snapshot-linked nameserver serve ...   # dies (exit 137) the first time it gets there

Only tests set the variable (tests/faults/test_crash_points.py); unset, a crash point costs one
dictionary lookup. The process ends with os._exit, as a SIGKILL would end it: no cleanup, no flush.
"""

from __future__ import annotations

import os

ENV = "RIP18_CRASH_POINT"
EXIT_CODE = 137  # what a shell reports for a process killed by SIGKILL

# Every point, so a test can name them and a typo fails at once.
POINTS = (
    "snapshot-file-written",  # the writer: the snapshot file is durable under its name, raft.dump not yet linked
    "snapshot-linked",        # the writer: raft.dump links the new file, pysyncobj not yet told it is done
    "install-staged",         # an install (restart or from the leader): staged, not yet imported into the store
    "install-imported",       # an install: in the store, the state not yet loaded from it
)


def crash_point(name: str) -> None:
    if os.environ.get(ENV) == name:
        assert name in POINTS, name
        os._exit(EXIT_CODE)
