"""The route body cache: reused only for the very bytes it was encoded from, and bounded."""

from __future__ import annotations

from nameserver.remoting.bodycache import BodyCache


def test_same_route_bytes_reuse_the_body_other_bytes_encode_again() -> None:
    cache = BodyCache()
    encoded: list[bytes] = []

    def enc(body: bytes):
        return lambda: encoded.append(body) or body

    assert cache.get("T", False, b"r1", enc(b"one")) == b"one"
    assert cache.get("T", False, b"r1", enc(b"never")) == b"one"
    assert cache.get("T", True, b"r1", enc(b"fast")) == b"fast"  # the other dialect is its own entry
    assert cache.get("T", False, b"r2", enc(b"two")) == b"two"   # the route changed
    assert cache.get("T", False, b"r1", enc(b"one again")) == b"one again"
    assert encoded == [b"one", b"fast", b"two", b"one again"]
    assert (cache.hits, cache.misses) == (1, 4)


def test_the_cache_holds_at_most_its_bound_oldest_first_out() -> None:
    cache = BodyCache(max_entries=3)
    for i in range(10):
        cache.get(f"T{i}", False, b"r", lambda i=i: str(i).encode())
    assert len(cache) == 3
    assert cache.get("T9", False, b"r", lambda: b"x") == b"9"   # the newest is kept
    assert cache.get("T0", False, b"r", lambda: b"x") == b"x"   # the oldest went
