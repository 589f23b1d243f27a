"""Command line: ``python -m ascend_attn_rt {demo,bench} [options]``.

  demo   continuous batching of a small Llama-shaped decoder on CPU, checked
         against dense attention (see ascend_attn_rt/demo.py)
  bench  host-time benchmark through the Python facade, no-compute provider
         (see ascend_attn_rt/bench.py; benchmarks/bench_host.py is the same)
"""

import argparse
import sys


def main(argv=None) -> int:
    from . import bench, demo

    parser = argparse.ArgumentParser(prog="python -m ascend_attn_rt", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="{demo,bench}")
    demo.add_arguments(sub.add_parser("demo", help="continuous-batching demo, checked against dense attention"))
    bench.add_arguments(sub.add_parser("bench", help="host-time benchmark (no_compute provider)"))
    args = parser.parse_args(argv)
    return demo.run(args) if args.command == "demo" else bench.run(args)


if __name__ == "__main__":
    sys.exit(main())
