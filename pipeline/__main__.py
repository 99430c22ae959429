"""Entry point: `python -m pipeline JOB ...`, or `spark-submit --py-files pipeline.zip pipeline/__main__.py JOB ...`."""

import os
import sys

# Before grpc is imported: the pipeline forks only to exec Spark's JVM (PySpark, with preexec_fn), and
# gRPC's fork handlers can kill such a child while a channel to a node is active (grpc/grpc#43055).
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "0")

from pipeline.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
