"""JSON request headers decoded once per shape (nameserver/remoting/headercache.py): a header repeated but
for its opaque is decoded from the cache, and every header decodes exactly as the full decoder decodes it,
those built to make a kept shape lie among them."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nameserver.remoting import header
from nameserver.remoting.command import Command, FrameError
from nameserver.remoting.headercache import MAX_FIELDS, JsonHeaders

ROUTE = (b'{"code":105,"extFields":{"topic":"TopicTest"},"flag":0,"language":"JAVA","opaque":%d,'
         b'"serializeTypeCurrentRPC":"JSON","version":479}')


def full(head: bytes) -> Command | str:
    try:
        return header.decode_json(head)
    except FrameError as exc:
        return f"FrameError: {exc}"


def cached(cache: JsonHeaders, head: bytes) -> Command | str:
    try:
        return cache.decode(head)
    except FrameError as exc:
        return f"FrameError: {exc}"


def test_a_header_repeated_but_for_its_opaque_is_decoded_once() -> None:
    cache = JsonHeaders()
    for opaque in (1, 2, 0, -5, 2147483647, -2147483648, 77):
        assert cache.decode(ROUTE % opaque) == header.decode_json(ROUTE % opaque)
    assert cache.hits == 6 and len(cache) == 1


def test_a_decoded_request_is_its_own() -> None:
    cache = JsonHeaders()
    first = cache.decode(ROUTE % 1)
    second = cache.decode(ROUTE % 2)
    second.ext_fields["topic"] = "changed"  # a handler's change to one request reaches no other
    second.body = b"x"
    assert cache.decode(ROUTE % 3).ext_fields == {"topic": "TopicTest"} == first.ext_fields
    assert (first.opaque, second.opaque) == (1, 2)


# Shapes in which the first `"opaque":` digits are not (only) the request's opaque, each decoded with two
# values there: the first, which the full decoder also reads as the request's opaque, then another.
LYING = [
    (b'{"code":105,"extFields":{"opaque":%d}}', 0, 7),  # no top-level opaque: 0
    (b'{"code":105,"x":{"opaque":%d}}', 0, 9),  # in a member nothing reads
    (b'{code:105,opaque:3,"extFields":{"opaque":%d}}', 3, 4),  # the top-level one with a bare key
    (b'{"code":105,"opaque":%d,"opaque":1}', 1, 2),  # the last one counts
    (b'{"code":105,"extFields":{"opaque":%d},"opaqu\\u0065":5}', 5, 6),  # the top-level one escaped
    (b'{"code":105,"extFields":{"a":"\\"opaque\\":%d"},"opaque":1}', 1, 2),  # inside a string
    (b'{"code":105,"extFields":{"a":{"opaque":%d}},"opaque":5}', 5, 6),  # in an object as an extFields value
]
# Headers whose opaque is no int32 literal, each after the same shape with a good one was kept.
BAD_OPAQUE = [b"2147483648", b"-2147483649", b"05", b"5.0", b"5e2", b"99999999999", b"1" * 5000, b"-", b"true",
              b'"5"', b"null"]


@pytest.mark.parametrize("shape,first,second", LYING)
def test_a_shape_whose_digits_could_be_something_else_is_decoded_in_full(shape: bytes, first: int,
                                                                        second: int) -> None:
    cache = JsonHeaders()
    for head in (shape % first, shape % second):
        assert cached(cache, head) == full(head)
    assert full(shape % first).opaque == first  # type: ignore[union-attr]
    assert cache.hits == 0


@pytest.mark.parametrize("opaque", BAD_OPAQUE)
def test_an_opaque_that_is_no_int32_literal_is_refused_as_the_full_decoder_refuses_it(opaque: bytes) -> None:
    cache = JsonHeaders()
    cache.decode(ROUTE % 1)
    head = ROUTE.replace(b"%d", opaque)
    assert cached(cache, head) == full(head)


def test_whitespace_around_the_opaque_is_decoded_in_full() -> None:
    cache = JsonHeaders()
    for opaque in (1, 2):
        head = b'{"code":105, "opaque" : %d, "flag":0}\n' % opaque
        assert cache.decode(head) == header.decode_json(head)
    assert cache.hits == 0


def test_the_cache_is_bounded() -> None:
    cache = JsonHeaders(max_entries=4)
    for i in range(10):
        cache.decode(ROUTE.replace(b"TopicTest", b"T%d" % i) % i)
    assert len(cache) == 4
    long_topic = b"x" * 2000  # past MAX_HEADER: never kept
    cache = JsonHeaders()
    for opaque in (1, 2):
        cache.decode(ROUTE.replace(b"TopicTest", long_topic) % opaque)
    assert len(cache) == 0 and cache.hits == 0
    many = b'{"code":105,"extFields":{%s},"opaque":%%d}' % b",".join(b'"k%d":"v"' % i for i in range(MAX_FIELDS + 1))
    for opaque in (1, 2):  # more extFields than a kept header may hold: never kept
        assert cache.decode(many % opaque) == header.decode_json(many % opaque)
    assert len(cache) == 0 and cache.hits == 0


def test_the_ext_fields_bound_applies_to_a_kept_shape() -> None:
    cache = JsonHeaders(max_ext_fields=1)
    head = b'{"code":105,"extFields":{"a":"1","b":"2"},"opaque":%d}'
    assert cache.decode(head % 1).invalid == cache.decode(head % 2).invalid == header.too_many_ext_fields(1)
    assert cache.hits == 1


# Headers whose members, nested or not, are spelled "opaque" in every way a decoder reads as that name.
KEYS = [b'"opaque"', b"opaque", b'"opaqu\\u0065"', b'"extFields"', b'"x"', b'"topic"']
SCALARS = [b"0", b"1", b"-2", b'"s"', b'"opaque"', b'"\\"opaque\\":1"', b"null"]


def _object(members: list[tuple[bytes, bytes]]) -> bytes:
    return b"{" + b",".join(key + b":" + value for key, value in members) + b"}"


_VALUES = st.recursive(st.sampled_from(SCALARS),
                       lambda inner: st.lists(st.tuples(st.sampled_from(KEYS), inner), max_size=3).map(_object),
                       max_leaves=8)
HEADERS = st.lists(st.tuples(st.sampled_from(KEYS), _VALUES), max_size=6).map(
    lambda members: _object([(b'"code"', b"105"), *members]))
FIRST_OPAQUE = re.compile(rb'"opaque":-?[0-9]+')


@settings(max_examples=400, deadline=None)
@given(st.lists(HEADERS, min_size=1, max_size=4), st.lists(st.integers(-3, 3), min_size=2, max_size=5))
def test_any_header_decodes_through_the_cache_as_in_full(heads: list[bytes], opaques: list[int]) -> None:
    cache = JsonHeaders()
    for head in heads:
        for opaque in opaques:  # the same header with its first `"opaque":` number made each opaque
            text = FIRST_OPAQUE.sub(b'"opaque":%d' % opaque, head, count=1)
            assert cached(cache, text) == full(text)
