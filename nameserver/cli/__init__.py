"""Command-line entry points: `nameserver` runs a node, `nsctl` administers a cluster."""
