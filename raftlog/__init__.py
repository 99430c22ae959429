"""The replicated log: record/entry format, pysyncobj binding, group commit, offsets, barrier.

This package's __init__ imports nothing: `import raftlog.codec` (the pipeline, the log format) or
`import raftlog.kvstate` (the pure state) loads no pysyncobj. pysyncobj is named only by the shim modules
(binding.py, journal.py, peerlinks.py, peerguard.py; an import contract), and patched only by
`raftlog.binding.install()`, which the first RaftNode calls.
"""
