"""Host time of a GQA DCP decode step and of a GQA PCP decode step beside the non-CP step
(docs/design/cp.md §4, §6.4, §11.5), 2 local gloo ranks, operator provider "no_compute"
(kernels return at once), bf16.

Per step: DcpMetadataBuilder.build once, then DcpAttentionImpl.forward per layer;
the collectives each forward issues (query all-gather, partial all-to-all) are
counted and their wall time (cp.Comm.collective_ns) is subtracted, so the figure is
the runtime's own host work: building, the FIA call, the wire packing and the merge
call. PCP 2 ("pcp2"): cp.PcpMetadataBuilder(pcp_size=2, pcp_rank=r) (the legacy sharded
KV mode, no DCP) + cp.PcpAttentionImpl(pcp=comm) on the same decode batch (every PCP rank
holds every decode row): the FIA over the rank's KV shard into the fp32 wire, one PCP
all-gather of the wire (counted, excluded) and the merge into the output rows. The non-CP figure is aar.MetadataBuilder.build + aar.AttentionImpl.forward on
the same per-rank shapes in the same process.

--fake-group: one process as rank 0 of torch's in-process fake 2-rank group
(torch.testing._internal.distributed.fake_pg: every collective returns at once, no
data moves), so the figure is the host work alone, without gloo's threads and
their wake-ups competing for the cores (the collectives' wall time is then ~0).

Run from the repository root:
  PYTHONPATH=python .venv/bin/python benchmarks/bench_gqa_dcp.py [--iters N] [--out FILE] [--fake-group]
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
H, HKV, D, B = 8, 1, 128, 128  # per-rank heads (Llama-3-8B at TP 4, KV head replicated -> DCP 2)
LAYERS = 32


def _batch(n, seq, W):
    qsl = torch.arange(n + 1, dtype=torch.int32)
    seq_lens = torch.full((n,), seq, dtype=torch.int32)
    per = -(-seq // (B * W))
    bt = (torch.arange(n * per, dtype=torch.int32) + 1).view(n, per)
    return qsl, seq_lens, bt, n * per + 1


def _median_us(xs):
    return round(statistics.median(xs) / 1e3, 2)


def _worker(rank, init_file, iters, results, fake=False):
    import ascend_attn_rt as aar

    if fake:
        from torch.testing._internal.distributed.fake_pg import FakeStore

        dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=WORLD)
    else:
        dist.init_process_group("gloo", init_method="file://" + init_file, rank=rank, world_size=WORLD,
                                timeout=datetime.timedelta(seconds=60))
    torch.set_num_threads(1)
    aar.set_provider("no_compute")
    comm = aar.cp.Comm(dist.group.WORLD, timeout_s=30.0)
    rows = {}
    with torch.inference_mode():
        for n, seq in ((1, 1024), (32, 2048), (128, 4096), (256, 4096)):
            key = f"decode batch {n}, seq {seq}"
            qsl, seq_lens, bt, nb = _batch(n, seq, WORLD)
            kc = torch.zeros(nb, B, HKV, D, dtype=torch.bfloat16)
            vc = torch.zeros_like(kc)
            q = torch.randn(n, H, D, dtype=torch.bfloat16)
            k = torch.randn(n, HKV, D, dtype=torch.bfloat16)
            out = torch.empty_like(q)
            # --- DCP
            b = aar.DcpMetadataBuilder(max_num_reqs=n, max_num_tokens=n, max_blocks_per_req=bt.shape[1],
                                       block_size=B, num_blocks=nb, dcp_world=WORLD, dcp_rank=rank)
            layer = aar.DcpAttentionImpl(comm, H, D, num_kv_heads=HKV)
            build_ns, fwd_ns = [], []
            calls = None
            for it in range(iters + 3):
                t0 = time.perf_counter_ns()
                md = b.build(qsl, seq_lens, bt)
                t1 = time.perf_counter_ns()
                c0, x0 = comm.calls, comm.collective_ns
                for _ in range(LAYERS):
                    layer.forward(q, k, k, kc, vc, md, out)
                t2 = time.perf_counter_ns()
                if it >= 3:
                    build_ns.append(t1 - t0)
                    fwd_ns.append((t2 - t1 - (comm.collective_ns - x0)) / LAYERS)
                    calls = (comm.calls - c0) / LAYERS
            dcp = {"build_us": _median_us(build_ns), "forward_per_layer_us_excl_collectives": _median_us(fwd_ns),
                   "collectives_per_layer": calls}
            dcp["step_us_excl_collectives"] = round(dcp["build_us"] + LAYERS * dcp["forward_per_layer_us_excl_collectives"], 1)
            # --- PCP 2 (sharded KV, no DCP): every rank holds every decode row
            pb = aar.cp.PcpMetadataBuilder(max_num_reqs=n, max_num_tokens=n, max_blocks_per_req=bt.shape[1],
                                           block_size=B, num_blocks=nb, pcp_size=WORLD, pcp_rank=rank)
            player = aar.cp.PcpAttentionImpl(H, D, pcp=comm, num_kv_heads=HKV)
            build_ns, fwd_ns = [], []
            for it in range(iters + 3):
                t0 = time.perf_counter_ns()
                md = pb.build(qsl, seq_lens, bt)
                t1 = time.perf_counter_ns()
                c0, x0 = comm.calls, comm.collective_ns
                for _ in range(LAYERS):
                    player.forward(q, k, k, kc, vc, md, out)
                t2 = time.perf_counter_ns()
                if it >= 3:
                    build_ns.append(t1 - t0)
                    fwd_ns.append((t2 - t1 - (comm.collective_ns - x0)) / LAYERS)
                    calls = (comm.calls - c0) / LAYERS
            pcp = {"build_us": _median_us(build_ns), "forward_per_layer_us_excl_collectives": _median_us(fwd_ns),
                   "collectives_per_layer": calls}
            pcp["step_us_excl_collectives"] = round(pcp["build_us"] + LAYERS * pcp["forward_per_layer_us_excl_collectives"], 1)
            # --- non-CP, same per-rank shapes (the whole sequence local)
            qsl1, seq1, bt1, nb1 = _batch(n, seq, 1)
            kc1 = torch.zeros(nb1, B, HKV, D, dtype=torch.bfloat16)
            b1 = aar.MetadataBuilder(max_num_reqs=n, max_num_tokens=n, max_blocks_per_req=bt1.shape[1], block_size=B,
                                     num_blocks=nb1)
            l1 = aar.AttentionImpl(H, D, num_kv_heads=HKV)
            build_ns, fwd_ns = [], []
            for it in range(iters + 3):
                t0 = time.perf_counter_ns()
                md1 = b1.build(qsl1, seq1, bt1)
                t1 = time.perf_counter_ns()
                for _ in range(LAYERS):
                    l1.forward(q, k, k, kc1, kc1, md1, out)
                t2 = time.perf_counter_ns()
                if it >= 3:
                    build_ns.append(t1 - t0)
                    fwd_ns.append((t2 - t1) / LAYERS)
            plain = {"build_us": _median_us(build_ns), "forward_per_layer_us": _median_us(fwd_ns),
                     "path": l1.last_path}
            plain["step_us"] = round(plain["build_us"] + LAYERS * plain["forward_per_layer_us"], 1)
            rows[key] = {"dcp2": dcp, "pcp2": pcp, "no_cp": plain}
    if fake:
        return rows
    results.put((rank, rows))
    results.close()
    results.join_thread()
    os._exit(0)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--out", default=None)
    p.add_argument("--fake-group", action="store_true",
                   help="rank 0 of an in-process fake 2-rank group (collectives free): the host work alone")
    args = p.parse_args()
    if args.fake_group:
        got = {0: _worker(0, None, args.iters, None, fake=True)}
    else:
        ctx = mp.get_context("spawn")
        results = ctx.Queue()
        with tempfile.TemporaryDirectory(prefix="aar_bench_dcp_") as tmp:
            init = os.path.join(tmp, "store")
            procs = [ctx.Process(target=_worker, args=(r, init, args.iters, results)) for r in range(WORLD)]
            for pr in procs:
                pr.start()
            got = dict(results.get(timeout=600) for _ in range(WORLD))
            for pr in procs:
                pr.join(timeout=30)
    report = {
        "benchmark": "gqa_dcp_decode_host",
        "group": "fake (in-process, collectives free)" if args.fake_group else "gloo, 2 local processes",
        "provider": "no_compute",
        "dtype": "bfloat16",
        "shapes": {"heads_per_rank": H, "kv_heads": HKV, "head_size": D, "block_size": B, "layers": LAYERS},
        "dcp_world": WORLD,
        "pcp_world": WORLD,
        "iters": args.iters,
        "torch": torch.__version__,
        "ranks": {str(r): got[r] for r in sorted(got)},
    }
    text = json.dumps(report, indent=2)
    if args.out:
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        with open(args.out, "w") as f:
            f.write(text + "\n")
    for key, row in got[0].items():
        s = row["no_cp"]
        for mode in ("dcp2", "pcp2"):
            d = row[mode]
            print(f"{key:28s} {mode.upper()} build {d['build_us']:7.1f} us + fwd "
                  f"{d['forward_per_layer_us_excl_collectives']:6.1f} us/layer "
                  f"({d['collectives_per_layer']:.0f} collectives/layer excluded) | no-CP build {s['build_us']:7.1f} us + "
                  f"fwd {s['forward_per_layer_us']:6.1f} us/layer ({s['path']})")


if __name__ == "__main__":
    main()
