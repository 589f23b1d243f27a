"""Command line: ``python -m ascend_attn_rt {bench,verify-npu} [options]``.

  bench  host-time benchmark through the Python facade, no-compute provider
         (see ascend_attn_rt/bench.py; benchmarks/bench_host.py is the same)
  verify-npu  every operator call of the runtime through torch_npu and through
         the CPU twin, max errors per call (include/ascend_attn_rt/verify_npu.h;
         build/aar_verify_npu is the C++ twin over the same table)

The continuous-batching demo is a program beside the package, not in it: from the repository
root, ``PYTHONPATH=python:examples/demo python -m aar_demo`` (``make demo``). ``demo`` here only
says so and exits with 2.
"""

import argparse
import sys

DEMO_MOVED = ("python -m ascend_attn_rt demo: the demo is not part of the package; it is a program in the "
              "source tree's examples/demo/. From the repository root run\n"
              "  PYTHONPATH=python:examples/demo python -m aar_demo [options]\n"
              "(`make demo` runs it for every attention backend).\n")


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
    from . import bench

    parser = argparse.ArgumentParser(prog="python -m ascend_attn_rt", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="{bench,verify-npu,demo}")
    bench.add_arguments(sub.add_parser("bench", help="host-time benchmark (no_compute provider)"))
    v = sub.add_parser("verify-npu", help="every operator call: torch_npu vs the CPU twin (exit 1 on a failure)")
    v.add_argument("--stand-in", default="", metavar="twin|perturbed:OPNAME",
                   help="without an NPU: the CPU twin stands in (perturbed:OPNAME perturbs that operator's output)")
    v.add_argument("--only", default="", metavar="SUBSTRING", help="rows whose operator or arguments contain it")
    v.add_argument("--list", action="store_true", help="print the rows without running them")
    sub.add_parser("demo", help="moved out of the package: PYTHONPATH=python:examples/demo python -m aar_demo",
                   description=DEMO_MOVED)
    # Known arguments only: the demo's options (--attention, ...) must reach the message below, not an
    # "unrecognized arguments" error.
    args, extra = parser.parse_known_args(argv)
    if args.command == "demo":
        sys.stderr.write(DEMO_MOVED)
        return 2
    if extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if args.command == "verify-npu":
        return verify_npu(args)
    return bench.run(args)


if __name__ == "__main__":
    sys.exit(main())
