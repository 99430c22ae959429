"""The differences the differential run (test_differential.py) accepts, each with its reason: the one source of
docs/remoting.md's "Still different" table.

Each Row is one line of that table; its `covers` say exactly which recorded differences it accepts. The
table in the docs is rendered from ROWS, and tests/unit/test_differential_explained.py checks that the
docs hold exactly that rendering. After editing ROWS:

    python -m tests.interop.explained --write     # rewrite the table in docs/remoting.md
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass

from .jars import LINE_4, LINE_5
from .recorder import Difference

DOC = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "remoting.md")
BEGIN = "<!-- EXPLAINED: rendered from tests/interop/explained.py; python -m tests.interop.explained --write -->"
END = "<!-- /EXPLAINED -->"


@dataclass(frozen=True)
class Covers:
    """A Difference is accepted when the code matches, the line matches (empty: both), the request holds
    `request`'s fields, and every differing field path fully matches `paths`. `kind` "only-ours": a request
    signature that only our side saw (the stock side did not answer in time or at all)."""
    code: int
    lines: tuple[str, ...] = ()
    paths: str = r".*"
    request: tuple[tuple[str, str], ...] = ()
    kind: str = "fields"

    def covers(self, line: str, d: Difference) -> bool:
        if d.code != self.code or (self.lines and line not in self.lines) or d.kind != self.kind:
            return False
        if any(d.request.get(k) != v for k, v in self.request):
            return False
        return all(re.fullmatch(self.paths, p) for p in d.fields)


@dataclass(frozen=True)
class Row:
    what: str  # the table's first column: code and part
    lines: str  # "both", "4.9.7" or "5.5.0"
    stock: str
    ours: str
    why: str
    covers: tuple[Covers, ...]


BOTH = (LINE_4, LINE_5)
UNANSWERED_ON_4_9 = r"<no response>|code|remark|header|body(\..*)?"  # 4.9.7 sends nothing for codes it lacks
TBW102_PERM = r"body\.queueDatas\[\d+\]\.perm"

ROWS: tuple[Row, ...] = (
    Row("319 body", "both", "NamesrvConfig and server settings (`listenPort`, `rocketmqHome`, ...)",
        "our public settings, plus the replicated NamesrvConfig switches", "different software; never a secret",
        (Covers(319, paths=r"(raw:)?body\..+"),)),
    Row("217, 313, 901, unknown codes", LINE_4, "no response at all (4.9.7 lacks them)", "0 / 0 / 0 / 3",
        "the 5.x behaviour; an answer beats a client timeout. A 105 for the topic that 217 registered then "
        "differs too",
        (*(Covers(code, (LINE_4,), UNANSWERED_ON_4_9) for code in (217, 313, 901, 999)),
         Covers(105, (LINE_4,), request=(("topic", "DiffRegTopic2"),)))),
    Row("105 with `__ZONE_MODE`", LINE_4, "unfiltered (4.9.7 has no zone hook)", "filtered by `__ZONE_NAME`",
        "the 5.x behaviour", (Covers(105, (LINE_4,), request=(("__ZONE_MODE", "true"),)),)),
    Row("BrokerData (105, 106)", LINE_4, "no `enableActingMaster` field", '`"enableActingMaster":false`',
        "one body for both lines; 4.9 clients ignore the field",
        tuple(Covers(code, (LINE_4,), r"body\..*\.enableActingMaster") for code in (105, 106))),
    Row("304 `brokerAddr`", "both", "the first broker of its map", "the lowest-id address of the first broker name",
        "every node answers the same", (Covers(304, paths=r"body\.brokerAddr"),)),
    Row("105 `TBW102` `perm`", "both", "5, 6 or 7", "5, 6 or 7",
        "timing, not a difference: mqadmin's internal producer asks for TBW102 when its timer fires, so whether "
        "an answer falls between wipeWritePerm and addWritePerm (perm 5, then 6, then the broker's 7) varies "
        "run to run",
        (Covers(105, (LINE_4,), TBW102_PERM + r"|body\.brokerDatas\[\d+\]\.enableActingMaster",
                (("topic", "TBW102"),)),
         Covers(105, (LINE_5,), TBW102_PERM, (("topic", "TBW102"),)))),
)

EXPLAINED: tuple[Covers, ...] = tuple(c for row in ROWS for c in row.covers)


def explained(line: str, d: Difference) -> bool:
    return any(c.covers(line, d) for c in EXPLAINED)


def table() -> str:
    """docs/remoting.md's table, rendered from ROWS."""
    out = ["| code | line | stock | ours | why |", "|---|---|---|---|---|"]
    out += [f"| {r.what} | {r.lines} | {r.stock} | {r.ours} | {r.why} |" for r in ROWS]
    return "\n".join(out)


def doc_table(text: str) -> str | None:
    """The table between the markers in the docs' text (None: no markers)."""
    m = re.search(re.escape(BEGIN) + r"\n(.*?)\n" + re.escape(END), text, re.S)
    return m.group(1) if m else None


def main(argv: list[str]) -> int:
    if argv[1:] != ["--write"]:
        print(table())
        return 0
    with open(DOC) as f:
        text = f.read()
    assert doc_table(text) is not None, f"no {BEGIN} ... {END} in {DOC}"
    text = re.sub(re.escape(BEGIN) + r"\n.*?\n" + re.escape(END), lambda _: f"{BEGIN}\n{table()}\n{END}", text,
                  flags=re.S)
    with open(DOC, "w") as f:
        f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
