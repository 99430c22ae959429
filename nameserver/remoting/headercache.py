"""JSON request headers decoded once per shape: a client repeats the same header but for its opaque (a route
read every 30 s per topic), and parsing it was a quarter of the listener's Python time per route read.

A header is kept as its bytes without the opaque's digits, beside the request it decodes to; a header
with those bytes around another opaque is that request with that opaque. That holds only where the
digits are the value of the header's one top-level "opaque" member, so a header is kept only when that
is certain from its text: no backslash (no escaped key can spell "opaque" and no quote sits inside a
string), the letters "opaque" exactly once, written `"opaque":` and followed by an integer that is the
opaque the full decoder read from the top level. Any other header is decoded in full every time.

Bounded: at most MAX_ENTRIES headers of at most MAX_HEADER bytes (a route read's is ~150; with ACL
fields ~400) and MAX_FIELDS extFields, the oldest dropped first: at most ~16 MiB however a client shapes
its headers (13 MiB measured with every entry at both limits). One listener's loop thread uses its own cache.
"""

from __future__ import annotations

import re

from nameserver.remoting import header
from nameserver.remoting.command import Command

MAX_ENTRIES = 4096  # one per client header shape: per topic read, per client kind
MAX_HEADER = 1024   # bytes; longer headers are decoded in full
MAX_FIELDS = 16     # extFields of a kept header (a route read sends 1-2, ACL adds 3-4): bounds what an entry holds
# an int32 literal as JSON writes it (no leading zeros); longer digit runs are out of range anyway
_OPAQUE = re.compile(rb'"opaque":(-?(?:0|[1-9][0-9]{0,9}))')
_INT32 = (-(1 << 31), (1 << 31) - 1)


class JsonHeaders:
    """decode(head) is header.decode_json(head, max_ext_fields), reusing what an earlier header of the same
    bytes but for its opaque decoded to."""

    def __init__(self, max_ext_fields: int = header.DEFAULT_MAX_EXT_FIELDS, max_entries: int = MAX_ENTRIES) -> None:
        self.max_ext_fields = max_ext_fields
        self.max_entries = max_entries
        self._entries: dict[bytes, Command] = {}
        self.hits = 0

    def decode(self, head: bytes) -> Command:
        found = _OPAQUE.search(head) if len(head) <= MAX_HEADER else None
        if found is None:
            return header.decode_json(head, self.max_ext_fields)
        start, end = found.span(1)
        key = head[:start] + head[end:]
        opaque = int(found.group(1))
        known = self._entries.get(key)
        if known is not None and _INT32[0] <= opaque <= _INT32[1]:
            self.hits += 1
            return known.with_opaque(opaque)
        doc = header.json_document(head)
        cmd = header.json_command(doc, self.max_ext_fields)
        # the digits are the top-level opaque's whole value, and nothing else in the text can be an opaque
        if type(doc.get("opaque")) is int and cmd.opaque == opaque and b"\\" not in head \
                and head.count(b"opaque") == 1 and len(cmd.ext_fields) <= MAX_FIELDS:
            if len(self._entries) >= self.max_entries:
                del self._entries[next(iter(self._entries))]
            self._entries[key] = cmd.with_opaque(0)
        return cmd

    def __len__(self) -> int:
        return len(self._entries)
