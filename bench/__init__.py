"""The benchmark tool: our cluster beside etcd, a gRPC echo ceiling and the stock RocketMQ NameServer
(docs/benchmarks.md). Apart from the product, as etcd keeps its benchmark tool apart from the server: it
starts real `nameserver serve` processes and talks to them over sockets, and no product package imports it
(an import-linter contract). Run it with `python -m bench` (make bench, make bench-quick)."""
