"""Route reads' service requests: built once per (topic, zone name), never for a name we refuse, bounded."""

from __future__ import annotations

from nameserver.remoting.routerequests import MAX_ZONE, RouteRequests


def test_a_topic_and_zone_get_one_request_reused() -> None:
    reqs = RouteRequests()
    first = reqs.get("T", "")
    assert first is not None and (first.topic, first.zone_name) == ("T", "")
    assert reqs.get("T", "") is first
    zoned = reqs.get("T", "az1")
    assert zoned is not None and zoned is not first and zoned.zone_name == "az1"
    assert len(reqs) == 2


def test_a_name_we_refuse_gets_no_request_and_is_kept_nowhere() -> None:
    reqs = RouteRequests()
    for bad in ("", "a/b", "x\x01y", "t" * 1000):
        assert reqs.get(bad, "") is None
        assert reqs.get(bad, "") is None  # checked again, never remembered
    assert len(reqs) == 0


def test_at_most_its_bound_oldest_first_out() -> None:
    reqs = RouteRequests(max_entries=3)
    kept = [reqs.get(f"T{i}", "") for i in range(10)]
    assert len(reqs) == 3
    assert reqs.get("T9", "") is kept[9]      # the newest is kept
    assert reqs.get("T0", "") is not kept[0]  # the oldest went: built anew


def test_a_long_zone_name_is_answered_but_not_kept() -> None:
    reqs = RouteRequests()
    zone = "z" * (MAX_ZONE + 1)  # the client's own text: kept, entries could each hold a header's worth
    first = reqs.get("T", zone)
    assert first is not None and first.zone_name == zone
    assert len(reqs) == 0
    assert reqs.get("T", "z" * MAX_ZONE) is not None and len(reqs) == 1
