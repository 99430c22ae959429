"""A restored snapshot's topic keys whose part of MetadataState's route index is not built yet.

At a million records, building the route index (topic -> queue datas, broker -> topics, unit topic lists)
was the largest part of a restart (1.1-1.3 s: a million new strings, pairs and set entries). A core's restore
keeps the topic/ keys, sorted, and builds the index after the node is ready, a chunk at a time on its apply
thread (raftlog/applier.py). Until then every read answers from both halves, without changing either:

- a topic's entry is the index's when it has one, else the one its pending keys give with the values the
  state holds now (`entry`): a topic the index does not hold has no indexed key outside the pending ones;
- a read of the whole index (every topic, a broker's topics, a unit list) is the index's plus what the
  pending keys give. Both are parts of the truth: the index is exact for every topic it has built, and a
  pending key counts only while the state holds it with a value the index takes.

A change to a topic not built yet (an applied entry) builds that topic first (`take`), so the index is
then exact for it; the chunks skip it. Pure, no threads: its owner holds the state's lock for a change
(the apply thread), and readers only read.
"""

from __future__ import annotations

import sys
from bisect import bisect_left
from collections.abc import Callable, Iterator

from nameserver.state import keys, topicqueues

# A key's queue data in the index: (topic, broker name, the encoded QueueData, its topicSysFlag)
Part = tuple[str, str, bytes, int]
CHUNK_KEYS = 20_000  # keys built per chunk: ~25 ms of the state lock each, quiet (reads wait that long at most)

_CUT = len(keys.TOPIC_PREFIX)


class PendingRoutes:
    def __init__(self, topic_keys: list[str]) -> None:
        """`topic_keys`: every topic/ key of the restored state, sorted."""
        self.keys = topic_keys
        self.cursor = 0  # the keys before it are built; a topic's keys are all on one side of it
        self.taken: set[str] = set()  # topics built out of turn (a change came first): the chunks skip them

    @property
    def done(self) -> bool:
        return self.cursor >= len(self.keys)

    def span(self, topic: str) -> tuple[int, int]:
        """Where `topic`'s keys are (an empty range when it has none)."""
        prefix = f"{keys.TOPIC_PREFIX}{topic}/"
        lo = bisect_left(self.keys, prefix)
        hi = bisect_left(self.keys, prefix[:-1] + "0", lo)  # "0" follows "/": past every key of the prefix
        return lo, hi

    def built(self, topic: str) -> bool:
        """The index holds `topic` as the state has it (built by a chunk or taken)."""
        return topic in self.taken or self.span(topic)[0] < self.cursor

    def next_chunk(self, size: int = CHUNK_KEYS) -> list[str]:
        """The next keys to build (at least `size` unless fewer are left, up to the end of a topic), taken."""
        ks = self.keys
        end = min(len(ks), self.cursor + size)
        if end < len(ks):
            topic, _, _ = ks[end - 1][_CUT:].partition("/")
            end = bisect_left(ks, f"{keys.TOPIC_PREFIX}{topic}0", end)  # the rest of that topic's keys
        chunk = ks[self.cursor:end]
        self.cursor = end
        if self.done:
            self.keys = []
        return chunk

    @staticmethod
    def parts(topic_keys: list[str], value_of: Callable[[str], bytes | None],
              sys_flag_of: Callable[[bytes], int | None]) -> Iterator[Part]:
        """The queue data each key gives the index, as MetadataState's build takes it (a key whose value is
        gone or does not parse, or whose broker part is no escaped name, gives none)."""
        brokers: dict[str, str | None] = {}  # a broker part's name, parsed once per broker, not once per key
        for key in topic_keys:
            topic, sep, part = key[_CUT:].partition("/")
            if not (sep and topic and part and "/" not in part):
                continue
            raw = value_of(key)
            flag = None if raw is None else sys_flag_of(raw)
            if raw is None or flag is None:
                continue
            name = brokers.get(part, "")
            if name == "":
                name = keys.broker_of_part(part)
                brokers[part] = name = None if name is None else sys.intern(name)
            if name is not None:
                yield topic, name, raw, flag

    def entry(self, topic: str, value_of: Callable[[str], bytes | None],
              sys_flag_of: Callable[[bytes], int | None]) -> topicqueues.Queues | None:
        """`topic`'s index entry as its pending keys give it now, None when they give none."""
        lo, hi = self.span(topic)
        entry: topicqueues.Queues | None = None
        for parsed, name, raw, _flag in self.parts(self.keys[lo:hi], value_of, sys_flag_of):
            if parsed == topic:  # a topic named with a '/' has no keys of its own
                entry = topicqueues.put(entry, name, raw)
        return entry

    def rest(self, value_of: Callable[[str], bytes | None], sys_flag_of: Callable[[bytes], int | None]
             ) -> Iterator[Part]:
        """What every key not built yet gives (a read of the whole index: slow, the window is short)."""
        return self.parts(self.keys[self.cursor:], value_of, sys_flag_of)
