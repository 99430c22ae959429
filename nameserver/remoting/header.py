"""Header codecs: JSON and ROCKETMQ binary (a request is answered in the codec it came in).

JSON as Java writes it: keys sorted, nulls omitted. We accept more than that: a trailing newline
(jsoncpp), extra fields (ACL signatures, serializeTypeCurrentRPC), numeric or boolean extFields values
(the C++ client sends queueId as a number), and fastjson's unquoted numeric keys.
"""

from __future__ import annotations

import json
import re
import struct
from typing import Any

from nameserver.remoting import codes, jsonfmt
from nameserver.remoting.command import Command, FrameError

DEFAULT_MAX_EXT_FIELDS = 256  # limits.remoting_max_ext_fields (a nameserver request carries ~15)
_SHOWN = 64  # characters of a bad value a message quotes: the message goes to the log and the reply
_INT32 = struct.Struct(">i")
_INT16 = struct.Struct(">h")
# code, language, version, opaque, flag
_FIXED = struct.Struct(">hbhii")


class _NotScalar(Exception):
    pass


def _ext_value(value: Any) -> str | None:
    # Java's extFields is Map<String, String>; other clients put typed scalars in it (the C++ client
    # sends queueId as a number). Objects and arrays are no client's: refused, never stored as text.
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value
    if isinstance(value, int | float):
        return str(value)
    raise _NotScalar


_INT_TEXT = re.compile(r"\s*[+-]?\d{1,20}\s*")  # int32 fields: longer digit strings are out of range anyway


def shown(value: Any) -> str:
    """A value as a message quotes it: its repr, cut to a few dozen characters."""
    text = repr(value)
    return text if len(text) <= _SHOWN else f"{text[:_SHOWN]}... ({len(text)} characters)"


def too_many_ext_fields(limit: int) -> str:
    return f"more than {limit} custom fields (extFields): limits.remoting_max_ext_fields is {limit}"


def _int(doc: dict, name: str, default: int | None = None) -> int:
    value = doc.get(name, default)
    if value is None:
        raise FrameError(f"header field {name!r} is missing")
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise FrameError(f"header field {name!r} is not an integer: {shown(value)}")
    if isinstance(value, str) and not _INT_TEXT.fullmatch(value):  # checked before int() reads a long text
        raise FrameError(f"header field {name!r} is not an integer: {shown(value)}")
    try:
        number = int(value)
    except ValueError:
        raise FrameError(f"header field {name!r} is not an integer: {shown(value)}") from None
    if not -(1 << 31) <= number < (1 << 31):
        raise FrameError(f"header field {name!r} is out of the int32 range: {number}")
    return number


def decode_json(data: bytes, max_ext_fields: int = DEFAULT_MAX_EXT_FIELDS) -> Command:
    return json_command(json_document(data), max_ext_fields)


def json_document(data: bytes) -> dict[str, Any]:
    """A JSON header parsed: the object it holds (FrameError when it is none)."""
    start = data.lstrip()[:1]
    if start != b"{":  # refused before the parser (and its fastjson retry) walks the whole header
        raise FrameError(f"header is not JSON: not a JSON object (it begins with {shown(start)})")
    try:
        doc = jsonfmt.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise FrameError(f"header is not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise FrameError("header is not a JSON object")
    return doc


def json_command(doc: dict[str, Any], max_ext_fields: int = DEFAULT_MAX_EXT_FIELDS) -> Command:
    """The request a parsed JSON header describes (FrameError for a field that is not what it must be)."""
    ext = doc.get("extFields") or {}
    if not isinstance(ext, dict):
        raise FrameError("header field 'extFields' is not an object")
    invalid = None
    if len(ext) > max_ext_fields:
        invalid, ext = too_many_ext_fields(max_ext_fields), {}
    remark = doc.get("remark")
    language = doc.get("language", "OTHER")
    fields: dict[str, str] = {}
    for key, raw in ext.items():
        try:
            value = _ext_value(raw)
        except _NotScalar:
            invalid = invalid or (f"the custom field <{str(key)[:64]}> must be a string, number, boolean or "
                                  f"null, not a JSON {'object' if isinstance(raw, dict) else 'array'}")
            continue
        if value is not None:
            fields[str(key)] = value
    return Command(
        code=_int(doc, "code"), language=language if isinstance(language, str) else str(language),
        version=_int(doc, "version", 0), opaque=_int(doc, "opaque", 0), flag=_int(doc, "flag", 0),
        remark=None if remark is None else str(remark), ext_fields=fields,
        serialize_type=codes.SERIALIZE_JSON, invalid=invalid)


# The common reply's header (no remark, no extFields: a route read's) as json.dumps below writes it, made
# without building and sorting a dict: that was a fifth of a route read's own time.
_PLAIN = '{"code":%d,"flag":%d,"language":%s,"opaque":%d,"serializeTypeCurrentRPC":"JSON","version":%d}'
_JAVA = json.dumps("JAVA")


def encode_json(cmd: Command) -> bytes:
    if cmd.remark is None and not cmd.ext_fields and type(cmd.code) is type(cmd.flag) is type(cmd.opaque) \
            is type(cmd.version) is int:
        language = _JAVA if cmd.language == "JAVA" else json.dumps(cmd.language, ensure_ascii=False)
        return (_PLAIN % (cmd.code, cmd.flag, language, cmd.opaque, cmd.version)).encode("utf-8")
    doc: dict[str, Any] = {"code": cmd.code, "flag": cmd.flag, "language": cmd.language, "opaque": cmd.opaque,
                           "serializeTypeCurrentRPC": "JSON", "version": cmd.version}
    if cmd.remark is not None:
        doc["remark"] = cmd.remark
    if cmd.ext_fields:
        doc["extFields"] = dict(sorted(cmd.ext_fields.items()))
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def take(self, n: int, what: str) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise FrameError(f"binary header truncated reading {what} ({n} bytes at {self.pos} of {len(self.data)})")
        out = self.data[self.pos:self.pos + n]
        self.pos += n
        return out

    def int32(self, what: str) -> int:
        return _INT32.unpack(self.take(4, what))[0]

    def int16(self, what: str) -> int:
        return _INT16.unpack(self.take(2, what))[0]

    def text(self, n: int, what: str, limit: int) -> str | None:
        """A string of n bytes: None when n is 0 (RocketMQSerializable.readStr), refused past `limit`.
        Bad UTF-8 reads as U+FFFD, as Java's decoder reads it."""
        if n == 0:
            return None
        if n > limit:
            raise FrameError(f"binary header: {what} length {n} exceeds its limit of {limit}")
        return self.take(n, what).decode("utf-8", errors="replace")


def read_rocketmq(data: bytes, max_ext_fields: int = DEFAULT_MAX_EXT_FIELDS) -> tuple[Command, int]:
    """A ROCKETMQ binary header as stock RocketMQ reads it, and the number of bytes its fields used.

    A zero-length remark, key or value is null: a null value is no field (as a JSON null is), and a
    null key names no field. Bytes after the fields are no error (frame.decode says where the body is)."""
    r = _Reader(data)
    code, lang, version, opaque, flag = _FIXED.unpack(r.take(_FIXED.size, "fixed fields"))
    remark = r.text(r.int32("remark length"), "remark", len(data))
    ext_len = r.int32("extFields length")
    end = r.pos + ext_len  # pairs are read while short of it (a last pair may pass it, inside the header)
    if ext_len > 0 and end > len(data):
        raise FrameError(f"binary header truncated reading extFields ({ext_len} bytes at {r.pos} of {len(data)})")
    ext: dict[str, str] = {}
    invalid = None
    pairs = 0
    while r.pos < end:
        if pairs >= max_ext_fields:  # the rest is not read: the request is answered with an error
            invalid, ext, r.pos = too_many_ext_fields(max_ext_fields), {}, end
            break
        pairs += 1
        key = r.text(r.int16("extFields key length"), "extFields key", ext_len)
        value = r.text(r.int32("extFields value length"), "extFields value", ext_len)
        if key is not None:
            if value is None:
                ext.pop(key, None)  # a later null replaces an earlier value (Java's map.put)
            else:
                ext[key] = value
    language = codes.LANGUAGES[lang] if 0 <= lang < len(codes.LANGUAGES) else "OTHER"
    return Command(code=code, language=language, version=version, opaque=opaque, flag=flag, remark=remark,
                   ext_fields=ext, serialize_type=codes.SERIALIZE_ROCKETMQ, invalid=invalid), r.pos


def decode_rocketmq(data: bytes, max_ext_fields: int = DEFAULT_MAX_EXT_FIELDS) -> Command:
    """A binary header on its own (bytes after its fields are ignored)."""
    return read_rocketmq(data, max_ext_fields)[0]


def _short(n: int) -> int:
    return (n + 0x8000) % 0x10000 - 0x8000  # Java's (short) cast: code and version are 16-bit here


def _string(text: str | None, length: struct.Struct) -> bytes:
    data = (text or "").encode("utf-8")  # null and "" are both written as length 0
    return length.pack(len(data)) + data


def encode_rocketmq(cmd: Command) -> bytes:
    lang = codes.LANGUAGES.index(cmd.language) if cmd.language in codes.LANGUAGES else codes.LANGUAGES.index("OTHER")
    ext = b"".join(_string(key, _INT16) + _string(value, _INT32) for key, value in cmd.ext_fields.items())
    return (_FIXED.pack(_short(cmd.code), lang, _short(cmd.version), cmd.opaque, cmd.flag) + _string(cmd.remark, _INT32)
            + _INT32.pack(len(ext)) + ext)
