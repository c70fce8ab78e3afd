"""`python3 -m tools.netbed ...` (from the repository root): the net bed's command line."""
import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
