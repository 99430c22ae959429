"""What executors import, packaged: the pipeline zip for spark-submit --py-files, or shipped by the jobs.

Executors need pipeline/, raftlog's codec, digest and protobuf modules, nameserver's protobuf modules and
the log format; nothing else of this project (raftlog's __init__ imports nothing, so no pysyncobj).
`python -m pipeline JOB --master spark://...` ships the zip itself (`ship`); under spark-submit, pass it
with --py-files.
"""

from __future__ import annotations

import os
import tempfile
import zipfile
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def make_zip(out: str) -> str:
    """pipeline/, raftlog's codec, digest and pb, nameserver/pb and the log format: what executors import."""
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        for pkg in ("pipeline", "raftlog/pb", "nameserver/pb", "nameserver/logformat"):
            for name in sorted(os.listdir(os.path.join(ROOT, pkg))):
                if name.endswith(".py"):
                    z.write(os.path.join(ROOT, pkg, name), f"{pkg}/{name}")
        for mod in ("raftlog/__init__.py", "raftlog/digest.py", "raftlog/codec.py", "nameserver/__init__.py"):
            z.write(os.path.join(ROOT, mod), mod)
    return out


def ship(spark: SparkSession) -> str:
    """Add the pipeline zip to the session: every executor (and each Python worker) imports from it."""
    out = make_zip(os.path.join(tempfile.mkdtemp(prefix="rip18-pipeline-"), "pipeline.zip"))
    spark.sparkContext.addPyFile(out)
    return out
