"""Benchmark harness: python -m bench.run --help (see bench/README.md)."""
