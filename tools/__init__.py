"""Tools beside the library. The Python ones are packages run from the repository root:
`python3 -m tools.netbed` (the net bed, docs/netbed.md)."""
