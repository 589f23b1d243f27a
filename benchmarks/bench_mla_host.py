"""Host time of the MLA backend with the no-compute operator provider.

build: MetadataBuilder.build for decode batches of 1/32/256 (block table passed in, and
kept in the builder's staging rows: zero copy) and a mixed batch with context chunks. forward: Impl.forward per layer for decode batches 1/32/256 at
DeepSeek-V2-Lite shapes (H=16, hidden 2048, no q-LoRA, L=512, P=128, R=64, V=128).
The no-compute provider covers the NPU operators and the layer's dense work
(projections, W_UK bmm, o_proj, norms, head padding: aar::ops::dense), so the
forward numbers are host work only: validation, views, and dispatch.

Run: PYTHONPATH=python .venv/bin/python benchmarks/bench_mla_host.py [--out benchmarks/results/mla_host.json]
"""

import argparse
import json
import math
import pathlib
import statistics
import time

import torch

import ascend_attn_rt as aar

mla = aar.mla


def timeit(fn, iters, warmup=20, repeats=25):
    """(median, best) over `repeats` short repeats of the mean time per call, in microseconds, after a warm-up.

    The median is the reported figure (like the other benchmarks); the best repeat (the one nobody interrupted on
    this shared machine) is kept beside it in the JSON's *_best_us fields."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        samples.append((time.perf_counter() - t0) / iters * 1e6)
    return statistics.median(samples), min(samples)


def record(results, group, key, fn, iters):
    med, best = timeit(fn, iters)
    results[group][key] = med
    results.setdefault(group.replace("_us", "_best_us"), {})[key] = best


def rope_tables(n, R):
    inv = 10000.0 ** (-torch.arange(0, R, 2, dtype=torch.float64) / R)
    a = torch.arange(n, dtype=torch.float64)[:, None] * inv
    return torch.cat([a.cos(), a.cos()], -1).to(torch.bfloat16), torch.cat([a.sin(), a.sin()], -1).to(torch.bfloat16)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="benchmarks/results/mla_host.json")
    args = ap.parse_args()
    torch.set_num_threads(1)
    aar.set_provider("no_compute")
    bs, mbr, R = 128, 64, 64
    cos, sin = rope_tables(mbr * bs, R)
    results = {"provider": "no_compute", "figures": "median of 25 repeats (best in *_best_us)", "build_us": {},
               "forward_us": {}}
    B_max = 256
    builder = mla.MetadataBuilder(max_num_reqs=B_max, max_num_tokens=4096, max_blocks_per_req=mbr, block_size=bs,
                                  num_blocks=B_max * mbr, cos_table=cos, sin_table=sin, max_model_len=mbr * bs)
    table = torch.arange(B_max * mbr, dtype=torch.int32).view(B_max, mbr)
    for B in (1, 32, 256):
        qsl = torch.arange(B + 1, dtype=torch.int32)
        seq = torch.full((B,), 1000, dtype=torch.int32)
        bt = table[:B].contiguous()
        record(results, "build_us", f"decode_{B}", lambda: builder.build(qsl, seq, bt), 200)
        # Zero copy: the engine keeps its block table in the builder's staging rows.
        staged = builder.block_table_staging[:B]
        staged.copy_(bt)
        record(results, "build_us", f"decode_{B}_staged_block_table", lambda: builder.build(qsl, seq, staged), 200)
    # Mixed: 32 decodes + 4 prefills of 256 new tokens with 3000 cached tokens each.
    q_lens = [1] * 32 + [256] * 4
    qsl = torch.tensor([0] + list(torch.tensor(q_lens).cumsum(0)), dtype=torch.int32)
    seq = torch.tensor([1000] * 32 + [3256] * 4, dtype=torch.int32)
    bt = table[:36].contiguous()
    md = builder.build(qsl, seq, bt)
    record(results, "build_us", "mixed_32d_4p_ctx", lambda: builder.build(qsl, seq, bt), 200)
    results["mixed_context_chunks"] = md.num_context_chunks

    H, hid, L, P, V = 16, 2048, 512, 128, 128
    g = torch.Generator().manual_seed(0)
    def w(o, i):
        return (torch.randn(o, i, generator=g) / math.sqrt(i)).to(torch.bfloat16)
    impl = mla.Impl(num_heads=H, hidden_size=hid, kv_lora_rank=L, qk_nope_head_dim=P, qk_rope_head_dim=R,
                    v_head_dim=V, q_proj=w(H * (P + R), hid), kv_a_proj_with_mqa=w(L + R, hid),
                    kv_a_layernorm=torch.ones(L, dtype=torch.bfloat16), kv_b_proj=w(H * (P + V), L),
                    o_proj=w(hid, H * V), scale=1.0 / math.sqrt(P + R))
    nb = B_max * mbr
    nope = torch.zeros(nb, bs, 1, L, dtype=torch.bfloat16)
    rope = torch.zeros(nb, bs, 1, R, dtype=torch.bfloat16)
    for B in (1, 32, 256):
        qsl = torch.arange(B + 1, dtype=torch.int32)
        seq = torch.full((B,), 1000, dtype=torch.int32)
        md = builder.build(qsl, seq, table[:B].contiguous())
        x = torch.randn(B, hid, dtype=torch.bfloat16)
        out = torch.empty_like(x)
        record(results, "forward_us", f"decode_{B}", lambda: impl.forward(x, nope, rope, md, out), 2000)
        # Serving engines run the model under inference mode (vLLM does); the forward then enters no guard.
        with torch.inference_mode():
            record(results, "forward_us", f"decode_{B}_inference_mode",
                   lambda: impl.forward(x, nope, rope, md, out), 2000)
    aar.set_provider("auto")
    out_path = pathlib.Path(args.out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
