"""``python -m aar_demo [options]``: the continuous-batching demo (see aar_demo/demo.py)."""

import sys

from .demo import main

# The guard matters: `--dcp N` spawns its ranks, and a spawned child imports this module again.
if __name__ == "__main__":
    sys.exit(main())
