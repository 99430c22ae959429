"""nsctl: the operator CLI of the Raft-replicated nameserver.

    nsctl [--endpoints host:port,...] [--json] [--timeout SECONDS] [--tls-ca CA [--tls-cert C --tls-key K]]
          [--token-file FILE (or env NSCTL_TOKEN)] COMMAND ...

Any node accepts any call (writes are forwarded to the leader), so a single call tries the endpoints in
order until one answers; `status` asks every endpoint.

This module is the command line (global flags, parser, main); the commands live in nsctl_cluster,
nsctl_metadata, nsctl_log, nsctl_controller, nsctl_plan and nsctl_shard, and the way they call the cluster
in nsctl_calls.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import Any

from nameserver.cli import render
from nameserver.cli.nsctl_calls import CommandError, Context, UsageError
from nameserver.cli.nsctl_cluster import add_cluster_commands, add_membership_commands
from nameserver.cli.nsctl_controller import add_controller_commands
from nameserver.cli.nsctl_log import add_log_commands
from nameserver.cli.nsctl_metadata import add_metadata_commands
from nameserver.cli.nsctl_plan import add_plan_command
from nameserver.cli.nsctl_shard import add_shard_commands
from nameserver.client import Credentials
from nameserver.client import parse_endpoints as client_endpoints
from nameserver.safetext import escape_controls

DEFAULT_ENDPOINTS = "127.0.0.1:9101,127.0.0.1:9102,127.0.0.1:9103"
ENDPOINTS_ENV = "NSCTL_ENDPOINTS"
TOKEN_ENV = "NSCTL_TOKEN"
DEFAULT_TIMEOUT_S = 5.0

Handler = Callable[[Context, argparse.Namespace], int]


def _global_options(parser: argparse.ArgumentParser, suppress: bool) -> None:
    """The global flags; repeated on every command (suppressed defaults) so they work after it too."""

    def default(value: Any) -> Any:
        return argparse.SUPPRESS if suppress else value

    parser.add_argument(
        "--endpoints",
        default=default(None),
        help=f"comma-separated host:port list (env {ENDPOINTS_ENV}, default {DEFAULT_ENDPOINTS})",
    )
    parser.add_argument("--json", action="store_true", default=default(False), help="print JSON")
    parser.add_argument("--tls-ca", default=default(None), help="CA certificate (PEM): use TLS")
    parser.add_argument("--tls-cert", default=default(None), help="client certificate (PEM) for mutual TLS")
    parser.add_argument("--tls-key", default=default(None), help="the client certificate's private key (PEM)")
    parser.add_argument("--token-file", default=default(None),
                        help=f"file holding a bearer token (env {TOKEN_ENV} holds one too)")
    parser.add_argument(
        "--timeout", type=float, default=default(DEFAULT_TIMEOUT_S),
        help="deadline in seconds for each command's call, shared by the endpoints it tries"
    )


class _Builder:
    """Adds leaf commands that share the global flags and carry their handler."""

    def __init__(self) -> None:
        self.common = argparse.ArgumentParser(add_help=False)
        _global_options(self.common, suppress=True)

    def command(
        self, subparsers: Any, name: str, handler: Handler, help_text: str
    ) -> argparse.ArgumentParser:
        parser = subparsers.add_parser(name, parents=[self.common], help=help_text, description=help_text)
        parser.set_defaults(handler=handler)
        return parser

    def group(self, subparsers: Any, name: str, help_text: str) -> Any:
        parser = subparsers.add_parser(name, help=help_text, description=help_text)
        return parser.add_subparsers(dest=f"{name}_command", required=True, metavar="COMMAND")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="nsctl", description="Administer a RIP-18 nameserver cluster.")
    _global_options(parser, suppress=False)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    builder = _Builder()
    add_cluster_commands(builder, sub)
    add_metadata_commands(builder, sub)
    add_membership_commands(builder, sub)
    add_log_commands(builder, sub)
    add_controller_commands(builder, sub)
    add_plan_command(builder, sub)
    add_shard_commands(builder, sub)
    return parser


def parse_endpoints(flag: str | None) -> list[str]:
    raw = flag if flag is not None else os.environ.get(ENDPOINTS_ENV) or DEFAULT_ENDPOINTS
    try:
        return client_endpoints(raw)  # the client library's rules: host:port, duplicates dropped
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def make_context(args: argparse.Namespace) -> Context:
    if args.timeout <= 0:
        raise UsageError("--timeout must be > 0")
    return Context(endpoints=parse_endpoints(args.endpoints), timeout=args.timeout, json=args.json,
                   credentials=make_credentials(args))


def make_credentials(args: argparse.Namespace) -> Credentials:
    if bool(args.tls_cert) != bool(args.tls_key):
        raise UsageError("--tls-cert and --tls-key go together")
    token = os.environ.get(TOKEN_ENV) or None
    if args.token_file:
        try:
            with open(args.token_file) as f:
                token = f.read().strip() or None
        except OSError as exc:
            raise UsageError(f"--token-file: {exc}") from None
    return Credentials(args.tls_ca, args.tls_cert, args.tls_key, token)


def _exit_code(exit_: SystemExit) -> int:
    code = exit_.code
    if code is None:
        return 0
    return code if isinstance(code, int) else 2


def main(argv: list[str] | None = None) -> int:
    with render.escaped_output():  # what a reply holds reaches the terminal with no control character
        return _main(sys.argv[1:] if argv is None else argv)


def _main(argv: list[str]) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:  # argparse exits itself on --help and usage errors
        return _exit_code(exit_)
    ctx: Context | None = None
    try:
        ctx = make_context(args)
        return args.handler(ctx, args)
    except UsageError as err:
        print(f"nsctl: error: {err}", file=sys.stderr)
        return 2
    except CommandError as err:
        print(f"error: {err.code}: {escape_controls(err.details)}", file=sys.stderr)
        return 1
    finally:
        if ctx is not None and "pool" in ctx.__dict__:  # channels were opened
            ctx.pool.close()


if __name__ == "__main__":
    sys.exit(main())
