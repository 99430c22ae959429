"""The two errors of bad input, shared by every layer that refuses it: the request checks
(nameserver/validation.py), the pure state and its translation (nameserver/state), and the RPC wrapper that
maps them to statuses (nameserver/api/rpc.py): ValidationError to INVALID_ARGUMENT, TooLargeError to
RESOURCE_EXHAUSTED. Imports nothing of the node, so the state can use it without importing the checks."""

from __future__ import annotations

MAX_MESSAGE = 1024  # the message rides in the gRPC status trailer (16 KiB of metadata at most)


class ValidationError(Exception):
    """A request field is invalid. `field` is its path in the request, `message` says why."""

    def __init__(self, field: str, message: str) -> None:
        if len(message) > MAX_MESSAGE:  # a backstop for messages that quote input unshortened
            message = message[:MAX_MESSAGE] + "..."
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class TooLargeError(ValidationError):
    """A size bound was exceeded (maps to RESOURCE_EXHAUSTED)."""
