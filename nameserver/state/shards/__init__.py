"""Sharding's pure layer (docs/scaling.md, "Sharding"): the directory of which Raft group holds each broker
set, the router of writes to a group, the merge of a topic's route across groups, and the moves of a set
between groups as translations. No I/O: the node's processes (nameserver/groups) drive them."""
