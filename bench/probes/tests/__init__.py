"""Tests of the benchmark scripts (run by `make test-bench`)."""
