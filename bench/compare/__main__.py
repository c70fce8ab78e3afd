"""`python3 -m bench.compare ...` (from the repository root): the side-by-side comparison
(compare.py)."""
import sys

from bench.compare.compare import main

if __name__ == "__main__":
    sys.exit(main())
