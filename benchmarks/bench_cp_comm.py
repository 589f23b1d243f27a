"""Per-call wall time of the CP collectives through cp.Comm versus the same collective
through torch.distributed directly, on 2 local gloo ranks (CPU), at DCP decode shapes
(docs/design/cp.md §8: the query all-gather along the head dim and the [Wd*H, D+1, Td] fp32
all-to-all of the partials). Both sides move the same bytes over the same gloo group,
so the difference is the interface's own host cost.

Run from the repository root:
  PYTHONPATH=python .venv/bin/python benchmarks/bench_cp_comm.py [--iters N] [--out FILE]
"""

import argparse
import datetime
import json
import os
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))

WORLD = 2


def _median_us(fn, iters):
    for _ in range(10):
        fn()
    dist.barrier()
    ts = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    dist.barrier()
    return round(statistics.median(ts) * 1e6, 1)


def _worker(rank, init_file, iters, results):
    import warnings

    import ascend_attn_rt as aar

    warnings.filterwarnings("ignore", category=FutureWarning)  # torch's renames of the c10d calls

    dist.init_process_group("gloo", init_method="file://" + init_file, rank=rank, world_size=WORLD,
                            timeout=datetime.timedelta(seconds=60))
    torch.set_num_threads(1)
    comm = aar.cp.Comm(dist.group.WORLD, timeout_s=30.0)
    rows = {}
    for td, h, d in ((1, 8, 128), (32, 8, 128), (256, 4, 128)):
        q = torch.randn(td, h, d, dtype=torch.bfloat16)
        q_out = torch.empty(td, WORLD * h, d, dtype=torch.bfloat16)
        wire = torch.randn(WORLD * h, d + 1, td)
        wire_out = torch.empty_like(wire)
        stage = torch.empty(WORLD * td, h, d, dtype=torch.bfloat16)

        def torch_gather():
            dist.all_gather_into_tensor(stage, q)
            q_out.view(td, WORLD, h, d).copy_(stage.view(WORLD, td, h, d).movedim(0, 1))

        key = f"Td={td},H={h},D={d}"
        rows[key] = {
            "all_gather_dim1_us": {
                "cp_comm": _median_us(lambda: comm.all_gather(q, 1, out=q_out), iters),
                "torch_distributed": _median_us(torch_gather, iters),
            },
            "all_to_all_single_us": {
                "cp_comm": _median_us(lambda: comm.all_to_all_single(wire, out=wire_out), iters),
                "torch_distributed": _median_us(lambda: dist.all_to_all_single(wire_out, wire), iters),
            },
        }
    results.put((rank, rows))
    results.close()
    results.join_thread()
    os._exit(0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=300)
    ap.add_argument("--out", default="benchmarks/results/cp_comm.json")
    args = ap.parse_args()
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    with tempfile.TemporaryDirectory(prefix="aar_bench_cp_") as tmp:
        procs = [ctx.Process(target=_worker, args=(r, os.path.join(tmp, "store"), args.iters, results), daemon=True)
                 for r in range(WORLD)]
        for p in procs:
            p.start()
        got = {}
        try:
            for _ in range(WORLD):
                rank, rows = results.get(timeout=300)
                got[rank] = rows
        finally:
            for p in procs:
                p.join(timeout=10)
                if p.is_alive():
                    p.terminate()
                    p.join(timeout=5)
    report = {
        "what": "median wall time per call, 2 gloo ranks on one host, rank 0's view",
        "torch": torch.__version__,
        "iters": args.iters,
        "results": got[0],
    }
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=2)
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
