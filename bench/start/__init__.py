"""The start of a large job on one machine: shoal-start-bench (start_bench.cc) and its summary."""
