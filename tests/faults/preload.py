"""LD_PRELOAD fault shims (clockshim.c, slowdisk.c in this directory), built with the machine's gcc."""

from __future__ import annotations

import hashlib
import os
import subprocess

HERE = os.path.dirname(os.path.abspath(__file__))


def build(source_name: str) -> str:
    """The shared object for tests/faults/<source_name>, built once per source content (cached)."""
    source = os.path.join(HERE, source_name)
    with open(source, "rb") as f:
        tag = hashlib.sha256(f.read()).hexdigest()[:16]
    out = os.path.expanduser(f"~/.cache/rip18/{source_name.removesuffix('.c')}-{tag}.so")
    if not os.path.exists(out):
        os.makedirs(os.path.dirname(out), exist_ok=True)
        subprocess.run(["gcc", "-shared", "-fPIC", "-O2", "-Wall", "-Werror", "-o", out + ".tmp", source, "-ldl"],
                       check=True)
        os.replace(out + ".tmp", out)
    return out
