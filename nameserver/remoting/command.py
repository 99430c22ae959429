"""A RemotingCommand: one request or response of the RocketMQ remoting protocol."""

from __future__ import annotations

from dataclasses import dataclass, field

from nameserver.remoting import codes


class FrameError(Exception):
    """A frame that cannot be decoded: the connection it came from is closed."""


class FrameRefused(FrameError):
    """A frame past one of the node's limits: answered with the reason (in the frame's header type, when
    it is one we write), then its connection is closed."""

    def __init__(self, message: str, serialize_type: int = codes.SERIALIZE_JSON) -> None:
        super().__init__(message)
        self.serialize_type = serialize_type if serialize_type in codes.SERIALIZE_TYPES else codes.SERIALIZE_JSON


@dataclass(slots=True)  # slots: made and read for every frame (a route read makes two)
class Command:
    code: int
    language: str = "JAVA"
    version: int = 0
    opaque: int = 0
    flag: int = 0
    remark: str | None = None
    ext_fields: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    serialize_type: int = codes.SERIALIZE_JSON  # how the header arrived; a response goes out the same way
    # A header that framed correctly but holds a field no handler may act on (an extFields value that
    # is an object or an array): the request is answered with this remark and never handled.
    invalid: str | None = None

    @property
    def is_response(self) -> bool:
        return bool(self.flag & codes.FLAG_RESPONSE)

    @property
    def is_oneway(self) -> bool:
        return bool(self.flag & codes.FLAG_ONEWAY)

    def with_opaque(self, opaque: int) -> Command:
        """A copy with another opaque (and extFields of its own)."""
        return Command(self.code, self.language, self.version, opaque, self.flag, self.remark, dict(self.ext_fields),
                       self.body, self.serialize_type, self.invalid)

    def ext(self, name: str) -> str | None:
        return self.ext_fields.get(name)

    def response(self, code: int = codes.SUCCESS, remark: str | None = None,
                 ext_fields: dict[str, str] | None = None, body: bytes = b"") -> Command:
        """The response to this request: opaque echoed, the response bit set, in the request's header type."""
        # positional: every reply is made here, and keywords cost a route read measurably more
        return Command(code, "JAVA", codes.SERVER_VERSION, self.opaque, codes.FLAG_RESPONSE, remark, ext_fields or {},
                       body, self.serialize_type)
