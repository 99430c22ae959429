"""A node's gRPC server with its guards: one assembly for the core and for its worker processes, so a
call meets the same checks whichever process the kernel gave its connection to."""

from __future__ import annotations

from concurrent import futures

import grpc

from nameserver import tlsconf
from nameserver.api import auth
from nameserver.api.callguard import CallGuard
from nameserver.api.rpc import DecodeGuard
from nameserver.config import NodeConfig


def new_server(cfg: NodeConfig, max_connections: int, *, reuse_port: bool = False,
               metrics: grpc.ServerInterceptor | None = None,
               chain: list[grpc.ServerInterceptor] | None = None) -> grpc.Server:
    """A gRPC server with the node's limits and interceptors, no services yet. `reuse_port`: the port is
    shared with the node's other processes (SO_REUSEPORT; all of them must set it); `metrics`: the RPC
    counter (nameserver/ops/metrics.py); `chain`: the interceptors, when the caller built them
    (interceptors(): the core's private listener shares them with its write channel)."""
    opts = [("grpc.max_send_message_length", cfg.max_message_bytes),
            ("grpc.max_receive_message_length", cfg.max_message_bytes),
            ("grpc.so_reuseport", 1 if reuse_port else 0),
            ("grpc.max_allowed_incoming_connections", max_connections),
            ("grpc.server_handshake_timeout_ms", cfg.grpc_handshake_timeout_ms),
            ("grpc.max_connection_idle_ms", cfg.grpc_idle_timeout_ms),
            ("grpc.max_concurrent_streams", cfg.grpc_max_streams_per_connection)]
    return grpc.server(futures.ThreadPoolExecutor(max_workers=cfg.workers, thread_name_prefix="grpc"),
                       options=opts, interceptors=chain if chain is not None else interceptors(cfg, metrics),
                       maximum_concurrent_rpcs=cfg.grpc_max_concurrent_rpcs)


def interceptors(cfg: NodeConfig, metrics: grpc.ServerInterceptor | None = None,
                 outermost: grpc.ServerInterceptor | None = None) -> list[grpc.ServerInterceptor]:
    """The node's guards around every call, outermost first. `outermost`: runs before every guard (the
    core's private listener and write channel: who the worker's caller was, nameserver/api/corelink.py).
    Each one's intercept_service is a function of the call's method and metadata alone, with no effect of
    its own: what is checked or counted per call happens in the handler it returns (a worker behind the
    Go front end builds a handler once per method and metadata, nameserver/api/frontchannel.py)."""
    # Outermost guard: no call holds a worker waiting on its client past a bound, and a call auth refuses
    # anyway is refused before its request arrives (nameserver/api/callguard.py).
    authz = auth.interceptor(cfg)
    chain: list[grpc.ServerInterceptor] = [] if outermost is None else [outermost]
    chain.append(CallGuard(cfg.grpc_progress_timeout_ms, cfg.grpc_max_streams, cfg.grpc_max_streams_per_caller,
                           refusal=authz.authorizer.refusal if authz is not None else None))
    if metrics is not None:  # RPCs are counted by an interceptor
        chain.append(metrics)
    # Auth runs inside metrics, so refused calls are counted too (nameserver/api/auth.py).
    if authz is not None:
        chain.append(authz)
    chain.append(DecodeGuard())  # undecodable request bytes: INVALID_ARGUMENT, not INTERNAL
    return chain


def listen_public(server: grpc.Server, cfg: NodeConfig) -> None:
    """Bind the node's [grpc] address, with TLS and the node's certificate when configured."""
    creds = tlsconf.server_credentials(cfg)
    try:
        port = (server.add_secure_port(cfg.grpc_addr, creds) if creds is not None
                else server.add_insecure_port(cfg.grpc_addr))
    except RuntimeError:  # grpcio >= 1.60 raises where older versions returned 0
        port = 0
    if port == 0:  # the commands print an OSError as one line and exit 1, not a traceback
        raise OSError(f"cannot listen on [node] grpc_addr {cfg.grpc_addr}: in use, or not an address of this host")


__all__ = ["interceptors", "listen_public", "new_server"]
