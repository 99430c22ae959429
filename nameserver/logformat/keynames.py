"""How a broker name is written inside a state key (the rule is described in nameserver/state/keys.py).

Here, in the shared vocabulary, because the key layout is public: the node builds and parses keys with
it (nameserver/state/keys.py) and the client's route cache reads names back out of watched keys. (The log
report, pipeline/report.py, only joins broker keys with topic keys: both escaped alike, it needs no decoding.)
"""

from __future__ import annotations

import re

ESCAPE = "~"
# Each character that cannot appear as itself in a key part, and what stands for it there.
ESCAPES: tuple[tuple[str, str], ...] = (("/", "~2F"), (ESCAPE, "~7E"))
_ENCODE = {char: code for char, code in ESCAPES}
_DECODE = {code: char for char, code in ESCAPES}
_TO_ESCAPE = re.compile("[" + re.escape("".join(_ENCODE)) + "]")


def escape(name: str) -> str:
    """The name as written in a key part: '/' and '~' escaped, everything else as it is."""
    if "/" not in name and ESCAPE not in name:
        return name  # every name of RocketMQ's usual characters: the key part is the name
    return _TO_ESCAPE.sub(lambda m: _ENCODE[m.group()], name)


def unescape(part: str) -> str | None:
    """The name a key part stands for; None when the part is not one escape() writes."""
    if "/" in part:
        return None
    if ESCAPE not in part:
        return part
    head, *escaped = part.split(ESCAPE)
    out = [head]
    for piece in escaped:  # each starts right after a '~': its two characters say which one it is
        char = _DECODE.get(ESCAPE + piece[:2])
        if char is None:
            return None
        out += (char, piece[2:])
    return "".join(out)
