"""The RegisterBrokerStream form of a registration: one place for splitting and reassembling.

A registration too big for one message (70,000 topics) goes as a header (the request without its
topics) followed by TopicConfigs chunks. nsctl, the client library, the remoting listener and the
follower-to-leader forward all split with `register_chunks`; the server reassembles with
`assemble_chunks`.
"""

from __future__ import annotations

from collections.abc import Iterable

from nameserver.pb import api_pb2
from nameserver.validation import MAX_TOPICS_PER_REGISTRATION, TooLargeError, ValidationError

STREAM_CHUNK_TOPICS = 5000  # topics per chunk; also the count above which senders stream
STREAM_THRESHOLD_BYTES = 3 * 1024 * 1024  # ... or the size (under gRPC's 4 MiB default)


def should_stream(request: api_pb2.RegisterBrokerRequest) -> bool:
    return len(request.topics) > STREAM_CHUNK_TOPICS or request.ByteSize() > STREAM_THRESHOLD_BYTES


def register_chunks(request: api_pb2.RegisterBrokerRequest, per_chunk: int = STREAM_CHUNK_TOPICS
                    ) -> list[api_pb2.RegisterBrokerChunk]:
    """The header without topics, then TopicConfigs of `per_chunk` topics each.

    A list, not a generator: a caller that fails over to another node can send it again whole.
    """
    header = api_pb2.RegisterBrokerRequest()
    header.CopyFrom(request)
    del header.topics[:]
    chunks = [api_pb2.RegisterBrokerChunk(header=header)]
    for start in range(0, len(request.topics), per_chunk):
        part = api_pb2.TopicConfigs(topics=request.topics[start:start + per_chunk])
        chunks.append(api_pb2.RegisterBrokerChunk(topics=part))
    return chunks


def assemble_chunks(chunks: Iterable[api_pb2.RegisterBrokerChunk]) -> api_pb2.RegisterBrokerRequest:
    """The inverse, checking the stream's shape and size as it arrives (before buffering it all)."""
    request: api_pb2.RegisterBrokerRequest | None = None
    for i, chunk in enumerate(chunks):
        part = chunk.WhichOneof("part")
        if i == 0:
            if part != "header":
                raise ValidationError("chunks[0]", "the first chunk must be the header")
            request = api_pb2.RegisterBrokerRequest()
            request.CopyFrom(chunk.header)
        elif part == "topics":
            assert request is not None
            request.topics.extend(chunk.topics.topics)
        else:
            raise ValidationError(f"chunks[{i}]", "only the first chunk may be a header")
        if request is not None and len(request.topics) > MAX_TOPICS_PER_REGISTRATION:
            raise TooLargeError("topics", f"more than {MAX_TOPICS_PER_REGISTRATION} topics")
    if request is None:
        raise ValidationError("chunks", "empty registration stream")
    return request
