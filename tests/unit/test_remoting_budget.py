"""The remoting listener's reply budget (replybudget.py) and its bounded log lines (ratelog.py)."""

from __future__ import annotations

import logging

import pytest

from nameserver.remoting.ratelog import RateLimitedLog, cut
from nameserver.remoting.replybudget import BUILD_FACTOR, SMALL_REPLY, ReplyBudget, Verdict

MIB = 1 << 20


def test_a_code_never_answered_reserves_the_whole_share_then_what_it_was_seen_to_need() -> None:
    budget = ReplyBudget(per_connection=8 * MIB, node=32 * MIB)
    assert budget.need(219) == 8 * MIB  # the code's first request: it probes
    assert budget.need(219) is None  # the others wait for its answer
    budget.unprobe(219)  # it got none (its connection closed): the next one probes
    assert budget.need(219) == 8 * MIB
    budget.learn(219, 2 * MIB)
    budget.learn(219, 1 * MIB)  # the largest is kept
    assert budget.need(219) == 2 * MIB * BUILD_FACTOR


def test_a_connection_at_its_share_waits_and_one_holding_nothing_may_take_a_large_reply() -> None:
    budget = ReplyBudget(per_connection=8 * MIB, node=32 * MIB)
    assert budget.reserve(0, 20 * MIB) is Verdict.SEND  # larger than the share, but nothing else held
    assert budget.reserve(1 * MIB, 7 * MIB) is Verdict.SEND
    assert budget.reserve(1 * MIB, 7 * MIB + 1) is Verdict.WAIT
    # a built reply larger than expected while earlier ones are unread: the connection is closed
    assert budget.admit(6 * MIB, 6 * MIB) is Verdict.CLOSE
    assert budget.closed_total == 1


def test_past_the_node_total_large_replies_are_busy_and_small_ones_still_go() -> None:
    budget = ReplyBudget(per_connection=8 * MIB, node=32 * MIB)
    budget.charge(32 * MIB)
    assert budget.reserve(0, 4 * MIB) is Verdict.BUSY
    assert budget.admit(0, SMALL_REPLY) is Verdict.SEND  # a route read to an idle connection
    assert budget.admit(1024, SMALL_REPLY) is Verdict.BUSY  # not to one that already holds replies
    budget.release(32 * MIB)
    assert budget.held == 0 and budget.reserve(0, 4 * MIB) is Verdict.SEND


def test_thousands_of_fresh_connections_first_route_reads_are_not_refused_for_reservations() -> None:
    """The fleet simulator's 9,000 connections, each sending its first route read (~1 KB replies) before
    any was answered: each reserved the 32 MiB share, the first eight filled the 256 MiB total with
    reservations and the rest were answered SYSTEM_BUSY, though the replies held were a few MiB."""
    budget = ReplyBudget(per_connection=32 * MIB, node=256 * MIB)
    route, reply = 105, 1024
    busy, held, waiting = 0, [], []
    for conn in range(9000):
        need = budget.need(route)
        if need is None:  # the server keeps it waiting (not read) until the code's first answer
            waiting.append(conn)
        elif budget.reserve(0, need) is Verdict.BUSY:
            busy += 1
        else:
            budget.charge(need)
            held.append(need)
    for need in held:  # the first answers are built: the code's size is learned, the reservations go
        budget.learn(route, reply)
        budget.release(need)
    for _ in waiting:
        need = budget.need(route)
        assert need is not None
        if budget.reserve(0, need) is Verdict.BUSY:
            busy += 1
        else:
            budget.charge(need)
    assert busy == 0
    assert budget.held == len(waiting) * reply * BUILD_FACTOR < budget.node  # 36 MB of 256 MiB


def test_log_lines_past_the_burst_are_counted_and_said_once(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="test.ratelog")
    now = [0.0]
    limited = RateLimitedLog(logging.getLogger("test.ratelog"), every_s=3600, burst=2, clock=lambda: now[0])
    written = [limited.warning("bad frame from %s: %s", "peer", "x" * 10_000) for _ in range(5)]
    assert written == [True, True, False, False, False] and limited.suppressed == 3
    assert all(len(r.getMessage()) < 400 for r in caplog.records)  # the 10,000 characters cut short
    now[0] += 3600  # the next interval
    assert limited.warning("bad frame from %s", "peer")
    assert "3 more such lines left out" in caplog.records[-1].getMessage()


def test_cut_says_how_long_the_value_was() -> None:
    assert cut("abc") == "abc" and cut(7) == 7
    assert cut("y" * 1000, 10) == "yyyyyyyyyy... (1000 characters)"
