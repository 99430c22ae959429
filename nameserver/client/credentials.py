"""How the client library and nsctl reach a secured cluster: a CA to verify the nodes, a client
certificate for mTLS, a bearer token (docs/operations.md, "Security"). All None: plaintext."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc

from nameserver import tlsconf


@dataclass(frozen=True)
class Credentials:
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    token: str | None = field(default=None, repr=False)  # never printed

    def connect(self, addr: str, options: Sequence[tuple[str, Any]] = ()) -> grpc.Channel:
        """A channel to `addr`: TLS when a CA or a certificate is given, the token on every call."""
        return tlsconf.open_channel(addr, ca_file=self.tls_ca, cert_file=self.tls_cert, key_file=self.tls_key,
                                    token=self.token, options=options)


PLAINTEXT = Credentials()
