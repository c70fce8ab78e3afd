"""The side-by-side comparison of shoal with its peers: `python3 -m bench.compare` (compare.py)."""
