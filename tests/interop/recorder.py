"""A recording TCP proxy for the RocketMQ remoting protocol, and a field-by-field comparison of two recordings.

    rec = Recorder("127.0.0.1:9876").start()      # rec.addr: give this to brokers/clients as namesrvAddr
    ... traffic ...
    rec.stop(); rec.exchanges                      # [Exchange(request, response or None)]
    diffs = compare(stock_rec.exchanges, our_rec.exchanges, aliases)

Frames are forwarded unchanged, as they arrive; a copy of each is decoded with nameserver.remoting's codec
(read-only use) and a response is paired with its request by (connection, opaque).
"""

from __future__ import annotations

import contextlib
import json
import re
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from nameserver.localports import free_ports
from nameserver.remoting import codes, frame
from nameserver.remoting.command import Command

from .dialect import dialect

CODE_NAMES = {100: "PUT_KV_CONFIG", 101: "GET_KV_CONFIG", 102: "DELETE_KV_CONFIG", 103: "REGISTER_BROKER",
              104: "UNREGISTER_BROKER", 105: "GET_ROUTEINFO_BY_TOPIC", 106: "GET_BROKER_CLUSTER_INFO",
              205: "WIPE_WRITE_PERM_OF_BROKER", 206: "GET_ALL_TOPIC_LIST_FROM_NAMESERVER",
              216: "DELETE_TOPIC_IN_NAMESRV", 217: "REGISTER_TOPIC_IN_NAMESRV", 219: "GET_KVLIST_BY_NAMESPACE",
              224: "GET_TOPICS_BY_CLUSTER", 304: "GET_SYSTEM_TOPIC_LIST_FROM_NS", 311: "GET_UNIT_TOPIC_LIST",
              312: "GET_HAS_UNIT_SUB_TOPIC_LIST", 313: "GET_HAS_UNIT_SUB_UNUNIT_TOPIC_LIST",
              318: "UPDATE_NAMESRV_CONFIG", 319: "GET_NAMESRV_CONFIG", 322: "QUERY_DATA_VERSION",
              327: "ADD_WRITE_PERM_OF_BROKER", 901: "GET_BROKER_MEMBER_GROUP", 904: "BROKER_HEARTBEAT"}


@dataclass
class Exchange:
    conn: int
    t: float
    request: Command
    response: Command | None = None
    t_response: float = 0.0


def _recv_exactly(sock: socket.socket, n: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        try:
            chunk = sock.recv(n - len(buf))
        except OSError:
            return None
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


@dataclass
class Recorder:
    upstream: str
    name: str = "recorder"
    addr: str = ""
    exchanges: list[Exchange] = field(default_factory=list)
    undecodable: list[bytes] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _pending: dict = field(default_factory=dict)
    _socks: list = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _conn_ids: int = 0

    def start(self) -> Recorder:
        (port,) = free_ports(1)
        self._listener = socket.create_server(("127.0.0.1", port))
        self._listener.settimeout(0.5)
        self.addr = f"127.0.0.1:{port}"
        threading.Thread(target=self._accept, name=f"{self.name}-accept", daemon=True).start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._listener.close()
        with self._lock:
            socks = list(self._socks)
        for s in socks:
            with contextlib.suppress(OSError):
                s.close()

    def _accept(self) -> None:
        host, port = self.upstream.rsplit(":", 1)
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except (TimeoutError, OSError):
                continue
            try:
                server = socket.create_connection((host, int(port)), timeout=5)
                server.settimeout(None)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._conn_ids += 1
                cid = self._conn_ids
                self._socks += [client, server]
            for src, dst, up in ((client, server, True), (server, client, False)):
                threading.Thread(target=self._pump, args=(cid, src, dst, up), daemon=True,
                                 name=f"{self.name}-{cid}-{'up' if up else 'down'}").start()

    def _pump(self, cid: int, src: socket.socket, dst: socket.socket, upward: bool) -> None:
        try:
            while True:
                prefix = _recv_exactly(src, 4)
                if prefix is None:
                    break
                payload = _recv_exactly(src, int.from_bytes(prefix, "big"))
                if payload is None:
                    break
                # Recorded before it is forwarded: else the answer can come back (and find no request
                # to pair with) before the request is on record.
                self._record(cid, payload)
                try:
                    dst.sendall(prefix + payload)
                except OSError:
                    break
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def _record(self, cid: int, payload: bytes) -> None:
        try:
            cmd = frame.decode(payload)
        except Exception:  # noqa: BLE001 - a recording keeps what it cannot decode
            with self._lock:
                self.undecodable.append(payload)
            return
        now = time.monotonic()
        with self._lock:
            if cmd.is_response:
                ex = self._pending.pop((cid, cmd.opaque), None)
                if ex is not None:
                    ex.response, ex.t_response = cmd, now
            else:
                ex = Exchange(cid, now, cmd)
                self.exchanges.append(ex)
                if not cmd.is_oneway:
                    self._pending[(cid, cmd.opaque)] = ex

    def snapshot(self) -> list[Exchange]:
        with self._lock:
            return list(self.exchanges)


# ---- normalising and comparing ------------------------------------------------------------------------

# Request fields that differ run to run by nature (checksums of bodies holding timestamps, client ids).
VOLATILE_REQUEST_FIELDS = {"bodyCrc32", "AccessKey", "Signature", "OnsChannel", "timestamp"}
# Body and field keys whose values are times, counters of time or process ids: compared as "<present>".
VOLATILE_KEYS = {"timestamp", "bootTimestamp", "stateVersion", "counter", "pid", "clientId", "msgId",
                 "offsetMsgId", "startTimestamp"}

_UNQUOTED_INT_KEY = re.compile(r"([{,]\s*)(-?\d+):")


def parse_body(body: bytes) -> Any:
    """JSON (fastjson's unquoted integer keys fixed), key=value lines, or the text itself."""
    if not body:
        return None
    text = body.decode("utf-8", errors="replace")
    for candidate in (text, _UNQUOTED_INT_KEY.sub(r'\1"\2":', text)):
        try:
            return json.loads(candidate)
        except ValueError:
            pass
    if "=" in text and "\n" in text:  # properties text (GET_NAMESRV_CONFIG)
        return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
    return text


def _alias(value: Any, aliases: dict[str, str]) -> Any:
    if isinstance(value, str):
        for k in sorted(aliases, key=len, reverse=True):
            value = value.replace(k, aliases[k])
        return value
    if isinstance(value, dict):
        return {_alias(k, aliases): _alias(v, aliases) for k, v in value.items()}
    if isinstance(value, list):
        return [_alias(v, aliases) for v in value]
    return value


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """Paths to leaves. Lists are sorted by their JSON (ordering ignored); volatile keys become <present>."""
    out: dict[str, Any] = {}
    if isinstance(value, dict):
        if not value:
            out[prefix or "."] = {}
        for k, v in value.items():
            p = f"{prefix}.{k}" if prefix else str(k)
            if k in VOLATILE_KEYS:
                out[p] = "<present>"
            else:
                out |= flatten(v, p)
    elif isinstance(value, list):
        if not value:
            out[prefix] = []
        for i, v in enumerate(sorted(value, key=lambda x: json.dumps(x, sort_keys=True, default=str))):
            out |= flatten(v, f"{prefix}[{i}]")
    else:
        out[prefix] = value
    return out


NO_RESPONSE: dict[str, Any] = {"<no response>": True}


def response_fields(resp: Command | None, aliases: dict[str, str]) -> dict[str, Any]:
    """What a response says, flattened: code, remark, extFields, header serialization, body, and the body's
    dialect (raw: fields, dialect.py). Header language/version are stamps (ours are fixed: JAVA/479) and
    are left out."""
    if resp is None:
        return dict(NO_RESPONSE)
    fields: dict[str, Any] = {"code": resp.code, "remark": _alias(resp.remark, aliases) if resp.remark else None,
                              "header": "ROCKETMQ" if resp.serialize_type == codes.SERIALIZE_ROCKETMQ else "JSON"}
    for k, v in resp.ext_fields.items():
        fields[f"ext.{k}"] = "<present>" if k in VOLATILE_KEYS else _alias(v, aliases)
    body = _alias(parse_body(resp.body), aliases)
    fields |= {f"body.{k}" if k != "." else "body": v for k, v in flatten(body).items()} if isinstance(
        body, dict | list) else {"body": body}
    if isinstance(body, dict | list):
        fields |= {f"raw:body{p}": _alias(note, aliases)
                   for p, note in dialect(resp.body.decode("utf-8", "replace"), lambda v: _alias(v, aliases)).items()}
    return fields


def signature(req: Command, aliases: dict[str, str]) -> tuple:
    ext = tuple(sorted((k, _alias(v, aliases)) for k, v in req.ext_fields.items()
                       if k not in VOLATILE_REQUEST_FIELDS))
    if req.serialize_type == codes.SERIALIZE_ROCKETMQ:  # a binary-header client's requests: a group of their own
        ext += (("<header>", "ROCKETMQ"),)
    if req.code == 322:  # QUERY_DATA_VERSION: the answer depends on the DataVersion asked about
        body = parse_body(req.body)
        if isinstance(body, dict) and "counter" in body:
            ext += (("<dataVersion.counter>", str(body["counter"])),)
    return req.code, ext


@dataclass
class Difference:
    code: int
    request: dict[str, str]
    kind: str  # "fields" | "only-stock" | "only-ours"
    fields: dict[str, tuple[Any, Any]] = field(default_factory=dict)  # path -> (stock, ours)
    stock: list[dict] = field(default_factory=list)
    ours: list[dict] = field(default_factory=list)

    def render(self) -> str:
        name = CODE_NAMES.get(self.code, str(self.code))
        head = f"{self.code} {name} {json.dumps(self.request, sort_keys=True)}"
        if self.kind == "fields":
            lines = [f"  {p}: stock={json.dumps(s, default=str)} ours={json.dumps(o, default=str)}"
                     for p, (s, o) in sorted(self.fields.items())]
            return head + "\n" + "\n".join(lines)
        return f"{head}\n  sent {'only to the stock NameServer' if self.kind == 'only-stock' else 'only to ours'}"


def _diff_fields(a: dict, b: dict) -> dict[str, tuple[Any, Any]]:
    return {k: (a.get(k, "<absent>"), b.get(k, "<absent>")) for k in sorted(set(a) | set(b)) if a.get(k, "<absent>")
            != b.get(k, "<absent>")}


def _distance(a: dict, b: dict) -> int:
    """How far apart two responses are: a differing code or extField weighs more than a body field, so a
    response is matched with the one that says the same thing (e.g. changed=true with changed=true)."""
    return sum(10 if k == "code" or k.startswith("ext.") else 1 for k in _diff_fields(a, b))


def compare(stock: list[Exchange], ours: list[Exchange], stock_aliases: dict[str, str],
            our_aliases: dict[str, str], ignore_codes: frozenset[int] = frozenset()) -> list[Difference]:
    """Group each side's exchanges by request signature (code + request fields, addresses aliased); for each
    signature seen on both sides, compare the sets of distinct responses. A response seen on one side only
    is matched to the nearest response of the other side (fewest differing fields) for the field list."""
    def group(exs: list[Exchange], aliases: dict[str, str]) -> dict[tuple, list[dict]]:
        g: dict[tuple, list[dict]] = {}
        for ex in exs:
            if ex.request.code in ignore_codes:
                continue
            fields = response_fields(ex.response, aliases) if not ex.request.is_oneway else {"<oneway>": True}
            lst = g.setdefault(signature(ex.request, aliases), [])
            if fields not in lst:
                lst.append(fields)
        # A request the client gave up on (it timed out, or closed its connection first) while the same request
        # was answered another time says nothing about the server: of such a signature only answers count.
        for lst in g.values():
            if len(lst) > 1 and NO_RESPONSE in lst:
                lst.remove(NO_RESPONSE)
        return g

    gs, go = group(stock, stock_aliases), group(ours, our_aliases)
    diffs: list[Difference] = []
    for sig in sorted(set(gs) | set(go), key=lambda s: (s[0], str(s[1]))):
        code, ext = sig
        req = dict(ext)
        if sig not in go:
            diffs.append(Difference(code, req, "only-stock", stock=gs[sig]))
            continue
        if sig not in gs:
            diffs.append(Difference(code, req, "only-ours", ours=go[sig]))
            continue
        only_s = [r for r in gs[sig] if r not in go[sig]]
        only_o = [r for r in go[sig] if r not in gs[sig]]
        if not only_s and not only_o:
            continue
        merged: dict[str, tuple[Any, Any]] = {}
        for r in only_s:
            best = min(go[sig], key=lambda o, r=r: _distance(r, o))
            merged |= _diff_fields(r, best)
        for o in only_o:
            best = min(gs[sig], key=lambda s, o=o: _distance(s, o))
            merged |= _diff_fields(best, o)
        if merged:
            diffs.append(Difference(code, req, "fields", merged, only_s, only_o))
    return diffs


def exchange_json(ex: Exchange, aliases: dict[str, str]) -> dict[str, Any]:
    """One exchange as JSON (addresses aliased), for the recordings kept beside a comparison."""
    def cmd(c: Command | None) -> dict[str, Any] | None:
        if c is None:
            return None
        return {"code": c.code, "language": c.language, "version": c.version, "flag": c.flag,
                "remark": _alias(c.remark, aliases), "ext": _alias(c.ext_fields, aliases),
                "body": _alias(parse_body(c.body), aliases)}
    return {"conn": ex.conn, "t": round(ex.t, 3), "request": cmd(ex.request), "response": cmd(ex.response)}


def render(diffs: list[Difference]) -> str:
    return "\n".join(d.render() for d in diffs) if diffs else "no differences"
