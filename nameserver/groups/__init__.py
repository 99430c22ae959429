"""Sharding's processes (docs/scaling.md, "Sharding", Step 2): what a group core and a worker do with
several Raft groups. The pure layer (directory, router, merge, moves) is nameserver/state/shards."""
