"""The log's export format, shared by the node (archiver, `nsctl log export`, `nsctl state dump`) and
the Spark pipeline: record types and their JSON rendering (`records`), Parquet log segments and state
dumps (`segments`, pyarrow only).

A neutral leaf: it imports the generated protobuf code and raftlog's codec, never the node's logic or
the pipeline (import contracts in pyproject.toml). `segments` is not imported here, so reading record
names does not load pyarrow.
"""
