"""gRPC credentials from the node's [tls] / [auth] settings, for its server and its node-to-node channels.

Node-to-node calls (forwarded writes, heartbeats, read indexes, the remoting listener's own calls)
carry the peer credential: the node's certificate as TLS client certificate and, when configured,
its peer token as `authorization: Bearer ...`. The token goes in by a client interceptor rather than
call credentials so that it also works on a plaintext dev channel.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import grpc

from nameserver import headers
from nameserver.config import NodeConfig

Options = Sequence[tuple[str, Any]]


def read_file(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def server_credentials(cfg: NodeConfig) -> grpc.ServerCredentials | None:
    """None when TLS is off (plaintext port)."""
    if not cfg.tls_enabled:
        return None
    pair = [(read_file(cfg.tls_key_file), read_file(cfg.tls_cert_file))]
    ca = read_file(cfg.tls_ca_file) if cfg.tls_ca_file else None
    if cfg.tls_client_auth == "none" or ca is None:
        return grpc.ssl_server_credentials(pair)  # callers identify with tokens
    # "require": mutual TLS, every client presents a certificate chaining to the CA (tokens still work on top)
    return grpc.ssl_server_credentials(pair, root_certificates=ca, require_client_auth=True)


def channel_credentials(ca_file: str | None = None, cert_file: str | None = None,
                        key_file: str | None = None) -> grpc.ChannelCredentials:
    """TLS trusting `ca_file` (else the system roots), presenting cert/key when given."""
    return grpc.ssl_channel_credentials(
        root_certificates=read_file(ca_file) if ca_file else None,
        private_key=read_file(key_file) if key_file and cert_file else None,
        certificate_chain=read_file(cert_file) if key_file and cert_file else None)


class _MetadataInterceptor(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,
                           grpc.StreamUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    """Adds fixed metadata (the bearer token, an acting role) to every call on a channel."""

    def __init__(self, metadata: list[tuple[str, str]]) -> None:
        self._md = metadata

    def _details(self, details: grpc.ClientCallDetails) -> grpc.ClientCallDetails:
        return _CallDetails(details.method, details.timeout, list(details.metadata or []) + self._md,
                            details.credentials, getattr(details, "wait_for_ready", None),
                            getattr(details, "compression", None))

    def intercept_unary_unary(self, continuation: Callable, details: grpc.ClientCallDetails, request: Any) -> Any:
        return continuation(self._details(details), request)

    def intercept_unary_stream(self, continuation: Callable, details: grpc.ClientCallDetails, request: Any) -> Any:
        return continuation(self._details(details), request)

    def intercept_stream_unary(self, continuation: Callable, details: grpc.ClientCallDetails,
                               request_iterator: Any) -> Any:
        return continuation(self._details(details), request_iterator)

    def intercept_stream_stream(self, continuation: Callable, details: grpc.ClientCallDetails,
                                request_iterator: Any) -> Any:
        return continuation(self._details(details), request_iterator)


class _CallDetails(grpc.ClientCallDetails):
    def __init__(self, method: str, timeout: float | None, metadata: Any, credentials: Any,
                 wait_for_ready: bool | None, compression: Any) -> None:
        self.method = method
        self.timeout = timeout
        self.metadata = metadata
        self.credentials = credentials
        self.wait_for_ready = wait_for_ready
        self.compression = compression


def open_channel(target: str, *, ca_file: str | None = None, cert_file: str | None = None,
                 key_file: str | None = None, tls: bool = False, token: str | None = None,
                 extra_metadata: list[tuple[str, str]] | None = None, options: Options = ()) -> grpc.Channel:
    """A client channel: TLS when `tls` or any file is given; a bearer token when `token`."""
    if tls or ca_file or cert_file:
        channel = grpc.secure_channel(target, channel_credentials(ca_file, cert_file, key_file),
                                      options=list(options))
    else:
        channel = grpc.insecure_channel(target, options=list(options))
    md = list(extra_metadata or [])
    if token:
        md.append((headers.AUTHORIZATION, f"Bearer {token}"))
    return grpc.intercept_channel(channel, _MetadataInterceptor(md)) if md else channel


def peer_channel(cfg: NodeConfig, target: str, options: Options = (), as_role: str = "") -> grpc.Channel:
    """A channel to a node (this one or a peer) carrying this node's peer credential."""
    md = [(headers.AS_ROLE, as_role)] if as_role and cfg.auth_enabled else []
    if not cfg.tls_enabled:
        return open_channel(target, token=cfg.peer_token if cfg.auth_enabled else None,
                            extra_metadata=md, options=options)
    return open_channel(target, tls=True, ca_file=cfg.tls_ca_file or None,
                        cert_file=cfg.tls_cert_file, key_file=cfg.tls_key_file,
                        token=cfg.peer_token if cfg.auth_enabled else None, extra_metadata=md,
                        options=options)
