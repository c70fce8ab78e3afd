"""`python3 bench/netbed ...`: the netbed command line (cli.py)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from netbed.cli import main  # noqa: E402

sys.exit(main())
