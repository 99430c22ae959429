"""Benchmarks run against a live cluster (start one with `make run`)."""
