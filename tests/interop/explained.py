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

ODD_BROKER = "team@host c \u00fc"  # the differential run's broker named with '@', a space and a unicode letter

DOC = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "remoting.md")
BEGIN = "<!-- EXPLAINED: rendered from tests/interop/explained.py; python -m tests.interop.explained --write -->"
END = "<!-- /EXPLAINED -->"


@dataclass(frozen=True)
class Covers:
    """A differing field is accepted when the code matches, the line matches (empty: both), the request holds
    `request`'s fields, and the field's path fully matches `paths`. `kind` "only-ours": a request
    signature that only our side saw (the stock side did not answer in time or at all)."""
    code: int
    lines: tuple[str, ...] = ()
    paths: str = r".*"
    request: tuple[tuple[str, str | None], ...] = ()  # a None value: the request lacks that field
    kind: str = "fields"

    def covers(self, line: str, d: Difference, path: str | None = None) -> bool:
        """Whether this accepts `d`'s field `path` (None: a difference with no fields, such as only-ours)."""
        if d.code != self.code or (self.lines and line not in self.lines) or d.kind != self.kind:
            return False
        if any(d.request.get(k) != v for k, v in self.request):
            return False
        return path is None or re.fullmatch(self.paths, path) is not None


@dataclass(frozen=True)
class Row:
    what: str  # the table's first column: code and part
    lines: str  # "both", "4.9.7" or "5.5.0"
    stock: str
    ours: str
    why: str
    covers: tuple[Covers, ...]


BOTH = (LINE_4, LINE_5)
UNANSWERED_ON_4_9 = r"<no response>|code|remark|header|(raw:)?body.*"  # 4.9.7 sends nothing for codes it lacks
TBW102_PERM = r"body\.queueDatas\[\d+\]\.perm"

ROWS: tuple[Row, ...] = (
    Row("319 body", "both", "NamesrvConfig and server settings (`listenPort`, `rocketmqHome`, ...)",
        "our public settings, plus the replicated NamesrvConfig switches", "different software; never a secret",
        (Covers(319, paths=r"(raw:)?body\..+"),)),
    Row("217, 901, unknown codes", LINE_4, "no response at all (4.9.7 lacks them)", "0 / 0 / 3",
        "the 5.x behaviour; an answer beats a client timeout. A 105 for the topic that 217 registered then "
        "differs too",
        (*(Covers(code, (LINE_4,), UNANSWERED_ON_4_9) for code in (217, 901, 999)),
         Covers(105, (LINE_4,), request=(("topic", "DiffRegTopic2"),)))),
    Row("105 with `__ZONE_MODE`", LINE_4, "unfiltered (4.9.7 has no zone hook)", "filtered by `__ZONE_NAME`",
        "the 5.x behaviour", (Covers(105, (LINE_4,), request=(("__ZONE_MODE", "true"),)),)),
    Row("BrokerData (105, 106)", LINE_4, "no `enableActingMaster` field", '`"enableActingMaster":false`',
        "one body for both lines; 4.9 clients ignore the field",
        tuple(Covers(code, (LINE_4,), r"body\..*\.enableActingMaster") for code in (105, 106))),
    Row("106, 901 integer map keys", "both", "`{0:\"...\"}` (fastjson's form) to every client",
        '`{"0":"..."}` to clients from 4.9.4, as stock writes routes (105)',
        "JSON-equal: fastjson and fastjson2 read both, as any JSON parser reads ours; one rule for every body "
        "with such a map (\"Bodies\" above)",
        (Covers(106, paths=r"raw:body\.brokerAddrTable\..+\.brokerAddrs\.\d+<key>"),
         Covers(901, paths=r"raw:body\.brokerMemberGroup\.brokerAddrs\.\d+<key>"))),
    Row("105 non-ASCII text", LINE_4, "`\\u00FC` (fastjson's BrowserCompatible, clients from 4.9.4)",
        "raw UTF-8", "JSON-equal; 5.x's fastjson2 writes raw UTF-8 in every body, and so do we",
        (Covers(105, (LINE_4,), r"raw:body\.[^<]*"),)),
    Row("103 with `heartbeatTimeoutMillis` 500", "both", "remark null; the broker expires after 500 ms",
        "remark `heartbeatTimeoutMillis 500 is outside 1000..3600000: registered with 1000`",
        "below a second a broker would expire between its heartbeats; brokers ignore a success's remark",
        (Covers(103, paths="remark", request=(("heartbeatTimeoutMillis", "500"),)),)),
    Row("106, 105 after a 500 ms heartbeat timeout", LINE_4, "still listed (4.9.7 expires every broker "
        "after 120 s, whatever it asked)", "expired after 1 s and a scan", "the 5.x behaviour",
        (Covers(106, (LINE_4,), request=(("diffPhase", "hb-waited"),)),
         Covers(105, (LINE_4,), request=(("topic", "DiffHbTopic"),)))),
    Row("318 remark, a stock key that changes nothing here (`clusterTest`, `productEnvName`)", "both", "null",
        "names the key and why it changes nothing here (null when every key was applied)",
        "a stock key we cannot apply should not pass unnoticed; mqadmin prints no remark of a success",
        (Covers(318, paths="remark"),)),
    Row("103 body (ORDER_TOPIC_CONFIG) contents", "both", "the table as it was at that registration",
        "the table as it was at that registration",
        "timing, not a difference: which registrations fall between the order topic's creation and its "
        "deletion (a broker's own registration races mqadmin's PUT_KV_CONFIG) varies run to run; both answer "
        '`{"table":{}}` once the namespace was emptied',
        (Covers(103, paths=r"body|body\.table.*|raw:body.*"),)),
    Row("105 to a ROCKETMQ-header request", LINE_5, "a JSON header", "a ROCKETMQ header, as 4.9.7",
        "a client decodes each frame by its own type byte; answering in the request's type is the 4.9.7 and "
        "remoting-wide rule", (Covers(105, (LINE_5,), "header", (("<header>", "ROCKETMQ"),)),)),
    Row("106 polled by the brokers while a short-lived broker is registered", LINE_5,
        "lists it or not", "lists it or not",
        "timing, not a difference: 5.x brokers ask 106 every 5 s, and whether one asks during the 500 ms "
        "heartbeat-timeout broker's life (1 s and a scan here) or the `team@host c ü` broker's is chance",
        (Covers(106, (LINE_5,), r"body\.brokerAddrTable\.(diff-hb-broker|" + ODD_BROKER + r")\..*"
                r"|body\.clusterAddrTable\.InteropCluster\[\d+\]", (("diffPhase", None),)),)),
    Row("105 `TOPIC_NOT_EXIST` remark to a client before 5.0", LINE_5, "5.x's FAQ address to every client",
        "the FAQ address of the client's line (4.x's to clients before 5.0)",
        "one server answers both lines: each client reads the text its own line's NameServer writes",
        (Covers(105, (LINE_5,), "remark", (("diffClient", "399"),)),)),
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
    """Every differing field of `d` is accepted by some row (one difference may hold fields of two rows)."""
    paths: list[str | None] = list(d.fields) or [None]
    return all(any(c.covers(line, d, p) for c in EXPLAINED) for p in paths)


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
