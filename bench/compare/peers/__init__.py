"""The peers' benchmarks that bench/compare runs (README.md)."""
