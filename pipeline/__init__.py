"""Spark pipeline over the exported metadata log: compaction, audit, reports, a synthetic fleet log.

Run `python -m pipeline --help`. Importing this package loads neither Spark nor pyarrow: the log
format (nameserver.logformat.segments) is also used by the node's archiver and by nsctl.
"""
