"""Host time of an MLA (DeepSeek-V3 absorbed decode) decode step under DCP 2 and under PCP 2 (docs/design/mla.md §6.2,
docs/design/cp.md §11, §11.5), beside the single-rank MLA step of the same shapes, operator provider "no_compute"
(kernels return correctly shaped outputs at once), bf16.

Per step: mla.MetadataBuilder.build once, then mla.Impl.forward of one layer; the figures are the build, the forward
and their sum. Decode batches of 32 and 256 requests at 1000-token contexts (block size 128, a 64-column block table
whose ids cycle over a pool of cache blocks: nothing is computed, so requests may share blocks), DeepSeek-V3 MLA
shapes at TP 8 (16 heads, hidden 7168, q-LoRA 1536, L 512, P/V 128, R 64). DCP 2: the builder with
dcp_world_size=2, dcp_rank=r, cp_kv_cache_interleave_size=1, the layer with dcp_comm=cp.Comm(group); its forward
issues the query all-gather and the partials' all-to-all. PCP 2: the builder with pcp_world_size=2, pcp_rank=r,
cp_kv_cache_interleave_size=1, the layer with pcp_comm; every PCP rank holds every decode row (its local rows are
the whole decode batch), its forward attends its KV shard into the fp32 [out | LSE] wire and issues one all-gather
of it (the merge follows). The collectives are counted per layer-step and their wall time (cp.Comm.collective_ns)
is subtracted. Single rank: the same builder and layer without CP, in the same process, on the same inputs. The
timing loop and the gloo / fake-group runs are benchmarks/_cp_bench.py's. Medians over --iters steps (after 5
warm-up steps), torch.set_num_threads(1), garbage collector off while timing, under torch.inference_mode(). The
provider is set back to "auto" afterwards.

Tensors are on the CPU (gloo's collectives need storage): the ATen glue the runtime issues around the kernels
(query staging copies, the copies into the merge workspace) goes through the no-compute-aware dense helpers.

--fake-group: one process as rank 0 of torch's in-process fake 2-rank group
(torch.testing._internal.distributed.fake_pg: every collective returns at once, no data moves), so the figure
is the host work alone, without gloo's threads and their wake-ups competing for the cores.

Run from the repository root:
  PYTHONPATH=python .venv/bin/python benchmarks/bench_mla_cp.py [--iters N] [--out FILE] [--fake-group]
"""

import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _cp_bench as cpb  # noqa: E402

WORLD = 2
INTERLEAVE = 1                      # cp_kv_cache_interleave_size (vLLM's default)
SIZES = (32, 256)                   # decode requests per step
SEQ = 1000                          # context length of every request (the new token included)
BS, MBR, POOL = 128, 64, 512        # block size, block-table columns, cache blocks (ids cycle over the pool)
H, HID, Q, L, P, V, R = 16, 7168, 1536, 512, 128, 128, 64  # DeepSeek-V3 MLA at TP 8
WARMUP = 5
DT = torch.bfloat16
MODES = (("dcp2", "dcp"), ("pcp2", "pcp"))


def _rope_tables(n):
    inv = 10000.0 ** (-torch.arange(0, R, 2, dtype=torch.float64) / R)
    a = torch.arange(n, dtype=torch.float64)[:, None] * inv
    return torch.cat([a.cos(), a.cos()], -1).to(DT), torch.cat([a.sin(), a.sin()], -1).to(DT)


def _layer_args():
    def w(o, i):
        return torch.zeros(o, i, dtype=DT)

    def v(n):
        return torch.zeros(n, dtype=DT)

    return dict(num_heads=H, hidden_size=HID, q_lora_rank=Q, kv_lora_rank=L, qk_nope_head_dim=P, qk_rope_head_dim=R,
                v_head_dim=V, q_a_proj=w(Q, HID), q_a_layernorm=v(Q), q_proj=w(H * (P + R), Q),
                kv_a_proj_with_mqa=w(L + R, HID), kv_a_layernorm=v(L), kv_b_proj=w(H * (P + V), L),
                o_proj=w(HID, H * V), scale=1.0 / (P + R) ** 0.5)


def _caches():
    return torch.zeros(POOL, BS, 1, L, dtype=DT), torch.zeros(POOL, BS, 1, R, dtype=DT)


def _measure(builder, impl, caches, n, iters, comm=None):
    """Medians of (build, forward, collectives) over iters steps, and the collectives per layer-step."""
    qsl = torch.arange(n + 1, dtype=torch.int32)
    seq = torch.full((n,), SEQ, dtype=torch.int32)
    bt = (torch.arange(n * MBR, dtype=torch.int32) % POOL).view(n, MBR)
    x = torch.zeros(n, HID, dtype=DT)
    out = torch.empty_like(x)
    nope, rope = caches
    return cpb.measure(lambda: builder.build(qsl, seq, bt), [("layer", lambda md: impl.forward(x, nope, rope, md, out))],
                       iters, WARMUP, comm)


def _bench(rank, iters):
    import ascend_attn_rt as aar

    mla = aar.mla
    torch.set_num_threads(1)
    aar.set_provider("no_compute")
    try:
        comm = aar.cp.Comm(torch.distributed.group.WORLD, timeout_s=30.0)
        cos, sin = _rope_tables(MBR * BS)
        args = _layer_args()
        common = dict(max_num_reqs=max(SIZES), max_num_tokens=4096, max_blocks_per_req=MBR, block_size=BS,
                      num_blocks=POOL, cos_table=cos, sin_table=sin)
        caches = _caches()
        rows = {}
        with torch.inference_mode():
            builder = mla.MetadataBuilder(**common)
            layer = mla.Impl(**args)
            dcp_builder = mla.MetadataBuilder(**common, dcp_world_size=WORLD, dcp_rank=rank,
                                              cp_kv_cache_interleave_size=INTERLEAVE)
            dcp_layer = mla.Impl(**args, dcp_comm=comm)
            pcp_builder = mla.MetadataBuilder(**common, pcp_world_size=WORLD, pcp_rank=rank,
                                              cp_kv_cache_interleave_size=INTERLEAVE)
            pcp_layer = mla.Impl(**args, pcp_comm=comm)
            for n in SIZES:
                dcp = _measure(dcp_builder, dcp_layer, caches, n, iters, comm)
                pcp = _measure(pcp_builder, pcp_layer, caches, n, iters, comm)
                single = _measure(builder, layer, caches, n, iters)
                row = {"dcp2": dcp, "pcp2": pcp, "single_rank": single}
                for mode, name in MODES:
                    row[f"ratio_{name}_over_single"] = cpb.ratio(row[mode]["step_us"], single["step_us"])
                    row[f"build_ratio_{name}"] = cpb.ratio(row[mode]["build_us"], single["build_us"])
                rows[f"decode_{n}"] = row
    finally:
        aar.set_provider("auto")
    return rows


def main():
    args, got, group = cpb.parse_and_run(__doc__.split("\n\n")[0], _bench, WORLD, "aar_bench_mla_cp_")
    report = {
        "benchmark": "mla_cp_decode_host",
        "group": group,
        "provider": "no_compute",
        "device": "cpu",
        "dtype": "bfloat16",
        "step": "MetadataBuilder.build + Impl.forward of one layer (collectives' wall time subtracted)",
        "shapes": {"num_heads": H, "hidden_size": HID, "q_lora_rank": Q, "kv_lora_rank": L, "qk_nope_head_dim": P,
                   "v_head_dim": V, "qk_rope_head_dim": R, "block_size": BS, "block_table_columns": MBR,
                   "cache_blocks": POOL, "seq_len": SEQ},
        "cp_world": WORLD,
        "cp_kv_cache_interleave_size": INTERLEAVE,
        "iters": args.iters,
        "warmup": WARMUP,
        "threads": 1,
        "torch": torch.__version__,
        "target_ratio_over_single": 1.5,
        "ranks": {str(r): got[r] for r in sorted(got)},
    }
    cpb.write_report(args.out, report)
    print(f"MLA decode step host time, {report['group']}, provider no_compute, us (median of {args.iters})")
    for r in sorted(got):
        for key, row in got[r].items():
            s = row["single_rank"]
            print(f"rank {r} {key:10s} single build {s['build_us']:6.1f} + fwd {s['forward_us']:6.1f} ="
                  f" {s['step_us']:6.1f}")
            for mode, name in MODES:
                d = row[mode]
                print(f"    {mode:6s} build {d['build_us']:8.1f} + fwd {d['forward_us']:9.1f} = {d['step_us']:9.1f}"
                      f" ({cpb.collectives_text(d)}) | ratio step"
                      f" {row['ratio_' + name + '_over_single']:.2f}x, build {row['build_ratio_' + name]:.2f}x"
                      f" (target <= 1.5x)")


if __name__ == "__main__":
    main()
