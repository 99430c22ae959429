"""The RIP-18 nameserver: state machine, request translation, liveness, gRPC services, CLI.

Entry points: `nameserver.server.Server` (one node), `nameserver.cli.nsctl` (operator CLI).
"""
