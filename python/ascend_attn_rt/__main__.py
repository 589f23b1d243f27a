"""Command line: ``python -m ascend_attn_rt {demo,bench,verify-npu} [options]``.

  demo   continuous batching of a small Llama-shaped decoder on CPU, checked
         against dense attention (see ascend_attn_rt/demo.py)
  bench  host-time benchmark through the Python facade, no-compute provider
         (see ascend_attn_rt/bench.py; benchmarks/bench_host.py is the same)
  verify-npu  every operator call of the runtime through torch_npu and through
         the CPU twin, max errors per call (include/ascend_attn_rt/verify_npu.h;
         build/aar_verify_npu is the C++ twin over the same table)
"""

import argparse
import sys


def verify_npu(args) -> int:
    try:  # torch_npu registers the NPU device; absent here, the CLI refuses unless --stand-in
        import torch_npu  # noqa: F401
    except Exception:
        pass
    from . import _C

    cli = []
    if args.stand_in:
        cli += ["--stand-in", args.stand_in]
    if args.only:
        cli += ["--only", args.only]
    if args.list:
        cli.append("--list")
    rc, text = _C.verify_npu_cli(cli)
    (sys.stderr if rc == 2 else sys.stdout).write(text)
    return rc


def main(argv=None) -> int:
    from . import bench, demo

    parser = argparse.ArgumentParser(prog="python -m ascend_attn_rt", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="{demo,bench,verify-npu}")
    demo.add_arguments(sub.add_parser("demo", help="continuous-batching demo, checked against dense attention"))
    bench.add_arguments(sub.add_parser("bench", help="host-time benchmark (no_compute provider)"))
    v = sub.add_parser("verify-npu", help="every operator call: torch_npu vs the CPU twin (exit 1 on a failure)")
    v.add_argument("--stand-in", default="", metavar="twin|perturbed:OPNAME",
                   help="without an NPU: the CPU twin stands in (perturbed:OPNAME perturbs that operator's output)")
    v.add_argument("--only", default="", metavar="SUBSTRING", help="rows whose operator or arguments contain it")
    v.add_argument("--list", action="store_true", help="print the rows without running them")
    args = parser.parse_args(argv)
    if args.command == "verify-npu":
        return verify_npu(args)
    return demo.run(args) if args.command == "demo" else bench.run(args)


if __name__ == "__main__":
    sys.exit(main())
