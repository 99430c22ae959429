"""The journal's reserved descriptors: with every other descriptor taken, a journal write still opens
its file (issue 11, attack 5: a connection flood made the term/vote store fail and the node exit)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from tests.cluster import ROOT

# Run in a child: it lowers its own descriptor limit and exhausts it.
CHILD = textwrap.dedent("""
    import json, os, resource, tempfile
    from raftlog.fdreserve import RESERVE
    from raftlog.journal import DurableJournal

    resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
    RESERVE.hold(8)  # as the node does at start (limits.reserved_fds)
    d = tempfile.mkdtemp()
    journal = DurableJournal(os.path.join(d, "raft.journal"))
    hog = []
    while True:  # take every descriptor left, as a flood of connections would
        try:
            hog.append(os.open(os.devnull, os.O_RDONLY))
        except OSError:
            break
    try:
        open(os.path.join(d, "probe"), "w")
        raise SystemExit("descriptors were not exhausted")
    except OSError:
        pass
    journal.setCurrentTerm(7, "n2")  # the term/vote store: a new file (without the reserve: exit 74)
    for fd in hog:
        os.close(fd)
    with open(journal.meta_path) as f:
        assert json.load(f)["currentTerm"] == 7
    print("term stored; reserve refilled to", RESERVE.held)
""")



def test_a_journal_write_gets_a_reserved_descriptor_when_none_is_left() -> None:
    res = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "term stored" in res.stdout, res.stdout + res.stderr
