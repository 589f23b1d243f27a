"""Host-time benchmark through the Python facade; thin entry for ascend_attn_rt.bench.

Run from the repository root:
  PYTHONPATH=python .venv/bin/python benchmarks/bench_host.py [--quick] [--out FILE]
(same as: python -m ascend_attn_rt bench ...)
"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))

from ascend_attn_rt.bench import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
