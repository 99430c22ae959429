"""The checker itself, on known-good and known-bad histories (it must find planted violations)."""

from tests.linearizability.checker import INF, Op, Result, check, check_key, settle_inconclusive, step


def b(p, t0, t1, owner, expected, status="ok", version=0, key="k"):
    return Op(p, key, "bind", t0, t1, status, owner=owner, expected=expected, version=version)


def r(p, t0, t1, found, owner="", version=0, key="k"):
    return Op(p, key, "read", t0, t1, "ok", owner=owner, version=version, found=found)


def rel(p, t0, t1, expected, status="ok", key="k"):
    return Op(p, key, "release", t0, t1, status, expected=expected)


def test_sequential_history_is_linearizable() -> None:
    h = [b(1, 0, 1, "a", 0, version=5), r(2, 2, 3, True, "a", 5), b(1, 4, 5, "b", 5, version=9),
         rel(2, 6, 7, 9), r(1, 8, 9, False)]
    assert check_key(h).ok


def test_stale_read_after_acknowledged_write_is_caught() -> None:
    h = [b(1, 0, 1, "a", 0, version=5), b(1, 2, 3, "b", 5, version=9), r(2, 4, 5, True, "a", 5)]
    assert not check_key(h).ok


def test_two_winners_of_a_must_not_exist_bind_are_caught() -> None:
    h = [b(1, 0, 2, "a", 0, version=5), b(2, 1, 3, "b", 0, version=6)]
    assert not check_key(h).ok


def test_concurrent_read_may_see_either_side_of_a_write() -> None:
    h = [b(1, 0, 1, "a", 0, version=5), b(1, 2, 6, "b", 5, version=9), r(2, 3, 4, True, "a", 5),
         r(3, 3, 5, True, "b", 9)]
    assert check_key(h).ok  # write in flight from 2 to 6: a, then b, is fine...
    h.append(r(2, 7, 8, True, "a", 5))  # ...but after it completed, "a" is stale
    assert not check_key(h).ok


def test_lost_acknowledged_write_is_caught() -> None:
    h = [b(1, 0, 1, "a", 0, version=5), r(2, 2, 3, False)]
    assert not check_key(h).ok


def test_unknown_outcome_may_or_may_not_apply() -> None:
    took = [b(1, 0, INF, "a", 0, status="unknown"), r(2, 5, 6, True, "a", 7)]
    assert check_key(took).ok  # the read pins the unknown version to 7
    never = [b(1, 0, INF, "a", 0, status="unknown"), r(2, 5, 6, False)]
    assert check_key(never).ok
    flip = [b(1, 0, INF, "a", 0, status="unknown"), r(2, 5, 6, True, "a", 7), r(2, 7, 8, False)]
    assert not check_key(flip).ok  # once seen applied, it cannot un-apply


def test_failed_cas_must_have_seen_a_different_version() -> None:
    ok = [b(1, 0, 1, "a", 0, version=5), b(2, 2, 3, "b", 4, status="fail")]
    assert check_key(ok).ok
    bad = [b(1, 0, 1, "a", 0, version=5), b(2, 2, 3, "b", 5, status="fail")]
    assert not check_key(bad).ok  # it had the right version: refusing it is a violation


def test_versions_must_grow() -> None:
    h = [b(1, 0, 1, "a", 0, version=5), b(1, 2, 3, "b", 5, version=4)]
    assert not check_key(h).ok


def test_keys_are_checked_independently() -> None:
    h = [b(1, 0, 1, "a", 0, version=5, key="x"), b(2, 0, 1, "a", 0, version=6, key="y"),
         r(3, 2, 3, True, "a", 6, key="x")]
    results = {res.key: res.ok for res in check(h)}
    assert results == {"x": False, "y": True}


def test_step_rejects_release_of_unbound() -> None:
    assert step(None, rel(1, 0, 1, 3)) == []
    assert step(None, rel(1, 0, 1, 3, status="fail")) == [None]


def test_larger_concurrent_history_is_checked_quickly() -> None:
    # 4 clients, 200 sequentially chained CAS writes with overlapping reads: linearizable.
    ops, version, owner, t = [], 0, "", 0.0
    for i in range(200):
        new = version + 3
        ops.append(b(i % 4, t, t + 2, f"o{i}", version, version=new))
        ops.append(r((i + 1) % 4, t + 0.5, t + 1.5, bool(owner) or i > 0, owner if i else "", version)
                   if i else r(1, t + 0.5, t + 1.5, False))
        owner, version, t = f"o{i}", new, t + 3
    res = check_key(ops)
    assert res.ok, res.detail


def test_a_key_the_search_gave_up_on_is_searched_again_not_failed() -> None:
    good = [b(1, 0, 1, "a", 0, version=5, key="g"), r(2, 2, 3, True, "a", 5, key="g")]
    bad = [b(1, 0, 1, "a", 0, version=5, key="x"), r(2, 2, 3, False, key="x")]
    gave_up = [Result(False, k, 2, "inconclusive: search budget exhausted", 1) for k in ("g", "x")]
    settled = settle_inconclusive(gave_up, good + bad)
    assert [(s.key, s.ok) for s in settled] == [("g", True), ("x", False)]  # a violation stays one
    assert settled[1].detail.startswith("no linearization")
    decided = [Result(True, "g", 2, "", 3)]
    assert settle_inconclusive(decided, []) == decided  # a verdict is not searched again
