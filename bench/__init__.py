"""shoal's benchmarks, a package so that its scripts import one another (`python3 -m bench.<group>.<script>`
from the repository root); README.md describes the groups."""
