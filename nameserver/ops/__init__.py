"""What operators run and watch beside the node: Prometheus metrics and the leader-change log line
(metrics.py), log formats (logfmt.py), descriptor limits (fdlimits.py), the Parquet log archiver
(archive.py, imported only when [archive] is on: it needs pyarrow) and offline restore (restore.py,
`nameserver restore`)."""

from nameserver.ops.logfmt import make_formatter
from nameserver.ops.metrics import LeaderWatch, MetricsEndpoint, NodeMetrics

__all__ = ["LeaderWatch", "MetricsEndpoint", "NodeMetrics", "make_formatter"]
