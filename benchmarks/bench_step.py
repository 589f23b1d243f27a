"""Host time of one whole eager decode step through the Python facade, operator provider "no_compute" (kernels return
correctly shaped outputs at once: the figures are the runtime's host work and the Python calls, no device compute).

v32: DeepSeek-V3.2 (SFA) at TP 8, decode batches of 256 requests (and 32) at 1000-token contexts: one
sfa.MetadataBuilder.build (block table passed in as a host tensor, copied into the builder's staging rows) plus 61
indexer-layer sfa.Impl.forward calls (every V3.2 layer has a lightning indexer: keys, weights and queries, the
indexer cache write, top-k into a TopkBuffer, sparse attention, W_UV, o_proj). Shapes: 16 heads, hidden 7168,
q-LoRA 1536, L 512, P/V 128, R 64, indexer 64 x 128, top-k 2048, block size 128, a 64-column block table. Every
tensor of the layers and the builder's device buffers on the meta device (shapes only), as bench_sfa_host.py's
forward.

v4: a DeepSeek-V4-like stack (shapes assumed, as bench_dsa_cp.py's: hidden 7168, 16 heads x 512 (RoPE 64), q-LoRA
1536, window 128, indexer 64 x 128 with top-k 512, 2 o_proj groups of rank 1024, the A2 plan), decode batches of 256
(and 32) at 4000-token contexts: one dsa.StepBuilder.build, the seven KV-cache groups' GroupBuilder.build (host block
tables), dsa.route_layer for ratios 1, 4 and 128, then the layer mix (--v4-layers, default 61 layers: 2 SWA, 30 C4
with their own indexer top-k, 29 C128; an assumption: no design page gives V4's mix). Every tensor of the layers
and the builders' device buffers on the meta device by default (--v4-device cpu: CPU tensors, as bench_dsa_cp.py's
single rank, where the ATen glue around the kernels moves real data).

Timing: time.perf_counter_ns around the build and around the step's forwards, medians over --iters steps after 5
warm-up steps, torch.set_num_threads(1), garbage collector off while timing, under torch.inference_mode(). The
provider is set back to "auto" afterwards.

Run from the repository root:
  PYTHONPATH=python .venv/bin/python benchmarks/bench_step.py [--iters N] [--out FILE] [--only v32|v4|builds]
                                                              [--sizes 256,32] [--v4-layers 1:2,4:30,128:29]
                                                              [--v4-device meta|cpu]

builds: each step's builds alone for the cases upstream's builds are measured on (1024 decodes, a mixed step, a
prefill of 8 x 2048 new tokens).
"""

import argparse
import gc
import json
import os
import pathlib
import platform
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))

import ascend_attn_rt as aar  # noqa: E402

WARMUP = 5
DT = torch.bfloat16


def _med_us(ns):
    return round(statistics.median(ns) / 1e3, 3)


def measure(build, layers, iters, kinds=None):
    """Medians over `iters` steps: build() returns the step's metadata; each of `layers` (fn(md)) is one layer.

    With `kinds` (one name per layer), each layer is timed as well and the median per kind (over its layers and the
    steps) is returned under "forward_us_by_kind"."""
    build_ns, fwd_ns, step_ns = [], [], []
    by_kind = {k: [] for k in (kinds or ())}
    gc.collect()
    gc.disable()
    try:
        for it in range(WARMUP + iters):
            t0 = time.perf_counter_ns()
            md = build()
            t1 = time.perf_counter_ns()
            if kinds is None:
                for fn in layers:
                    fn(md)
            else:
                for fn, k in zip(layers, kinds):
                    a = time.perf_counter_ns()
                    fn(md)
                    if it >= WARMUP:
                        by_kind[k].append(time.perf_counter_ns() - a)
            t2 = time.perf_counter_ns()
            if it >= WARMUP:
                build_ns.append(t1 - t0)
                fwd_ns.append(t2 - t1)
                step_ns.append(t2 - t0)
    finally:
        gc.enable()
    n = len(layers)
    row = {"build_us": _med_us(build_ns), "forwards_us": _med_us(fwd_ns), "step_us": _med_us(step_ns),
           "per_layer_us": round(statistics.median(fwd_ns) / 1e3 / n, 3), "layers": n,
           "step_us_min": round(min(step_ns) / 1e3, 3)}
    if kinds is not None:
        row["forward_us_by_kind"] = {k: _med_us(v) for k, v in by_kind.items() if v}
    return row


def _rope(rows, R):
    inv = 10000.0 ** (-torch.arange(0, R, 2, dtype=torch.float64) / R)
    a = torch.arange(rows, dtype=torch.float64)[:, None] * inv
    return torch.cat([a.cos(), a.cos()], -1).to(DT), torch.cat([a.sin(), a.sin()], -1).to(DT)


# ---------------------------------------------------------------------------------------------- DeepSeek-V3.2 (SFA)

V32_LAYERS = 61


def bench_v32(sizes, iters):
    sfa = aar.sfa
    bs, mbr, R, B_max = 128, 64, 64, max(sizes)
    H, hid, Q, L, P, V, NI, DI, K = 16, 7168, 1536, 512, 128, 128, 64, 128, 2048
    m = "meta"
    cos, sin = _rope(mbr * bs, R)
    nb = B_max * mbr
    builder = sfa.MetadataBuilder(max_num_reqs=B_max, max_num_tokens=4096, max_blocks_per_req=mbr, block_size=bs,
                                  num_blocks=nb, cos_table=cos, sin_table=sin, device=m)

    def w(o, i):
        return torch.empty(o, i, dtype=DT, device=m)

    def v(n):
        return torch.empty(n, dtype=DT, device=m)

    dims = dict(num_heads=H, hidden_size=hid, q_lora_rank=Q, kv_lora_rank=L, qk_nope_head_dim=P, qk_rope_head_dim=R,
                v_head_dim=V)
    impls, caches = [], []
    for _ in range(V32_LAYERS):
        ws = dict(q_a_proj=w(Q, hid), q_a_layernorm=v(Q), q_proj=w(H * (P + R), Q), kv_a_proj_with_mqa=w(L + R, hid),
                  kv_a_layernorm=v(L), kv_b_proj=w(H * (P + V), L), o_proj=w(hid, H * V))
        idx = dict(index_n_head=NI, index_head_dim=DI, index_topk=K, indexer_wq_b=w(NI * DI, Q),
                   indexer_wk=w(DI, hid), indexer_weights_proj=w(NI, hid), indexer_k_norm_weight=v(DI),
                   indexer_k_norm_bias=v(DI), use_index_cache=True)
        impls.append(sfa.Impl(**dims, **ws, **idx))
        caches.append([torch.empty(nb, bs, 1, L, dtype=DT, device=m), torch.empty(nb, bs, 1, R, dtype=DT, device=m),
                       torch.empty(nb, bs, 1, DI, dtype=DT, device=m)])
    topk = sfa.TopkBuffer(4096, K, device=m)
    table = torch.arange(B_max * mbr, dtype=torch.int32).view(B_max, mbr)
    rows = {}
    for B in sizes:
        qsl = torch.arange(B + 1, dtype=torch.int32)
        seq = torch.full((B,), 1000, dtype=torch.int32)
        bt = table[:B].contiguous()
        x = torch.empty(B, hid, dtype=DT, device=m)
        out = torch.empty_like(x)

        def build():
            return builder.build(qsl, seq, bt)

        layers = [(lambda md, impl=impl, kv=kv: impl.forward(x, kv, md, out, topk)) for impl, kv in zip(impls, caches)]
        rows[f"decode_{B}"] = measure(build, layers, iters)
    return rows


# ---------------------------------------------------------------------------------------------- DeepSeek-V4 (DSA)

V4_SEQ = 4000
CBS, POOL, MAXPOS = 128, 64, 8192
HID4, N4, D4, R4, Q4, WIN = 7168, 16, 512, 64, 1536, 128
NI4, DI4, K4, G4, OL4 = 64, 128, 512, 2, 1024
RATIOS = (1, 4, 128)
KINDS = ("swa", "c4_kv", "c128_kv", "c4_indexer_k", "c4_attn_state", "c4_indexer_state", "c128_state")
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32, "int8": torch.int8,
          "float8_e4m3fn": torch.float8_e4m3fn}
V4_DEFAULT_MIX = "1:2,4:30,128:29"


def _v4_weights(ratio, dev):
    def w(*shape, dtype=DT):
        return torch.empty(*shape, dtype=dtype, device=dev)

    ws = dict(wq_a=w(Q4, HID4), q_norm=w(Q4), wq_b=w(N4 * D4, Q4), wkv=w(D4, HID4), kv_norm=w(D4),
              attn_sink=w(N4, dtype=torch.float32), wo_a=w(G4, N4 * D4 // G4, OL4), wo_b=w(HID4, G4 * OL4))
    if ratio > 1:
        coff = 2 if ratio == 4 else 1
        ws.update(cmp_wkv=w(coff * D4, HID4), cmp_wgate=w(coff * D4, HID4), cmp_ape=w(ratio, coff * D4),
                  cmp_norm=w(D4))
    if ratio == 4:
        ws.update(idx_wq_b=w(NI4 * DI4, Q4), idx_weights_proj=w(NI4, HID4), idx_cmp_wkv=w(2 * DI4, HID4),
                  idx_cmp_wgate=w(2 * DI4, HID4), idx_cmp_ape=w(4, 2 * DI4), idx_cmp_norm=w(DI4))
    return ws


def _v4_caches(groups, dev):
    c = {}
    for kd, gb in groups.items():
        sp = gb.cache_spec
        c[kd] = torch.empty(sp["shape"], dtype=DTYPES[sp["dtype"]], device=dev)
        if kd == "c4_indexer_k":
            c["c4_indexer_scale"] = torch.empty(sp["scale_shape"], dtype=DTYPES[sp["scale_dtype"]], device=dev)
    return c


def _v4_kv(ratio, c):
    kw = {}
    if ratio == 4:
        kw = dict(compress_kv=c["c4_kv"], state=c["c4_attn_state"], indexer_state=c["c4_indexer_state"],
                  indexer_k=c["c4_indexer_k"], indexer_scale=c["c4_indexer_scale"])
    elif ratio == 128:
        kw = dict(compress_kv=c["c128_kv"], state=c["c128_state"])
    return aar.dsa.compose_kv_cache(swa_kv=c["swa"], **kw)


def parse_mix(text):
    mix = []
    for part in text.split(","):
        r, n = part.split(":")
        r, n = int(r), int(n)
        if r not in RATIOS or n < 0:
            raise SystemExit(f"--v4-layers: ratio must be one of {RATIOS} and count >= 0, got '{part}'")
        mix.append((r, n))
    return mix


def bench_v4(sizes, iters, mix, dev):
    dsa = aar.dsa
    cos, sin = _rope(MAXPOS, R4)
    sb = dsa.StepBuilder(max_num_reqs=max(sizes), max_num_tokens=4096, cos_table=cos, sin_table=sin,
                         compress_cos_table=cos, compress_sin_table=sin, head_dim=D4, window=WIN, num_heads_q=N4,
                         index_topk=K4, index_n_heads=NI4, index_head_dim=DI4, device=dev)
    gb, cols = {}, {}
    for kd in KINDS:
        probe = dsa.GroupBuilder(sb, kind=kd, cache_block_size=CBS, num_blocks=POOL)
        cols[kd] = -(-V4_SEQ // probe.block_size)
        gb[kd] = dsa.GroupBuilder(sb, kind=kd, cache_block_size=CBS, max_blocks_per_req=cols[kd], num_blocks=POOL)
    # One cache set per ratio, shared by that ratio's layers (nothing is computed; the host work per layer is the
    # same as with a cache per layer).
    caches = _v4_caches(gb, dev)
    kv = {r: _v4_kv(r, caches) for r in RATIOS}
    order = []
    for r, n in mix:
        order += [r] * n
    # One weight set per ratio, shared by that ratio's layers (a weight set is ~100 MB of CPU memory here; a layer
    # keeps references, so sharing changes no host work).
    weights = {r: _v4_weights(r, dev) for r in set(order)}
    layers_of = [dsa.Impl(weights[r], hidden_size=HID4, num_heads=N4, head_dim=D4, rope_dim=R4, q_lora_rank=Q4,
                          compress_ratio=r, index_n_heads=NI4, index_head_dim=DI4, index_topk=K4, o_groups=G4,
                          o_lora_rank=OL4)
                 for r in order]
    rows = {}
    for B in sizes:
        qsl = torch.arange(B + 1, dtype=torch.int32)
        seq = torch.full((B,), V4_SEQ, dtype=torch.int32)
        tables = {kd: (torch.arange(B * c, dtype=torch.int32) % POOL).view(B, c) for kd, c in cols.items()}
        x = torch.empty(B, HID4, dtype=DT, device=dev)
        out = torch.empty_like(x)

        def build():
            st = sb.build(qsl, seq)
            md = {kd: g.build(st, tables[kd]) for kd, g in gb.items()}
            return {r: dsa.route_layer(r, st, md) for r in RATIOS}

        layers = [(lambda routed, impl=impl, r=r: impl.forward(x, kv[r], routed[r], out))
                  for impl, r in zip(layers_of, order)]
        # The step timed as a whole; then again with every layer timed too (the per-kind medians: the clock reads
        # between layers are not in the step figure).
        row = measure(build, layers, iters)
        names = {1: "swa", 4: "c4_indexer", 128: "c128"}
        row["forward_us_by_kind"] = measure(build, layers, iters, [names[r] for r in order])["forward_us_by_kind"]
        # The same step with every group's table kept in the builder's staging rows (zero copy).
        staged = {}
        for kd, g in gb.items():
            st_rows = g.block_table_staging[:B]
            st_rows[:, :cols[kd]].copy_(tables[kd])
            staged[kd] = st_rows[:, :cols[kd]]

        def build_staged():
            st = sb.build(qsl, seq)
            md = {kd: g.build(st, staged[kd]) for kd, g in gb.items()}
            return {r: dsa.route_layer(r, st, md) for r in RATIOS}

        s_row = measure(build_staged, layers, iters)
        row["staged_tables"] = {k: s_row[k] for k in ("build_us", "forwards_us", "step_us")}
        rows[f"decode_{B}"] = row
    return rows


def bench_v4_builds(iters, dev):
    """The V4 step's builds alone (StepBuilder.build + 7 GroupBuilder.build + route_layer x 3, host tables) for the
    cases upstream's build is measured on: 1024 decodes, a mixed step, a prefill."""
    dsa = aar.dsa
    cos, sin = _rope(MAXPOS, R4)
    sb = dsa.StepBuilder(max_num_reqs=1024, max_num_tokens=16384, cos_table=cos, sin_table=sin,
                         compress_cos_table=cos, compress_sin_table=sin, head_dim=D4, window=WIN, num_heads_q=N4,
                         index_topk=K4, index_n_heads=NI4, index_head_dim=DI4, device=dev)
    gb, cols = {}, {}
    for kd in KINDS:
        probe = dsa.GroupBuilder(sb, kind=kd, cache_block_size=CBS, num_blocks=POOL)
        cols[kd] = -(-V4_SEQ // probe.block_size)
        gb[kd] = dsa.GroupBuilder(sb, kind=kd, cache_block_size=CBS, max_blocks_per_req=cols[kd], num_blocks=POOL)
    cases = {"decode_1024": ([1] * 1024, [V4_SEQ] * 1024),
             "mixed_64d_4x512_on_3000": ([1] * 64 + [512] * 4, [V4_SEQ] * 64 + [3512] * 4),
             "prefill_8x2048": ([2048] * 8, [2048] * 8)}
    rows = {}
    for name, (q_lens, seq_lens) in cases.items():
        n = len(q_lens)
        qsl = torch.tensor([0] + list(torch.tensor(q_lens).cumsum(0)), dtype=torch.int32)
        seq = torch.tensor(seq_lens, dtype=torch.int32)
        tables = {kd: (torch.arange(n * c, dtype=torch.int32) % POOL).view(n, c) for kd, c in cols.items()}

        def build():
            st = sb.build(qsl, seq)
            md = {kd: g.build(st, tables[kd]) for kd, g in gb.items()}
            return {r: dsa.route_layer(r, st, md) for r in RATIOS}

        rows[name] = measure(build, [lambda md: None], iters)["build_us"]
    return rows


def bench_v32_builds(iters):
    """The SFA build alone (host block table) for 1024 decodes, a mixed step, a prefill (as bench_sfa_host.py)."""
    sfa = aar.sfa
    bs, mbr, R = 128, 64, 64
    cos, sin = _rope(mbr * bs, R)
    builder = sfa.MetadataBuilder(max_num_reqs=1024, max_num_tokens=16384, max_blocks_per_req=mbr, block_size=bs,
                                  num_blocks=1024 * mbr, cos_table=cos, sin_table=sin, device="meta")
    cases = {"decode_1024": ([1] * 1024, [1000] * 1024),
             "mixed_32d_4x256_on_3000": ([1] * 32 + [256] * 4, [1000] * 32 + [3256] * 4),
             "prefill_8x2048": ([2048] * 8, [2048] * 8)}
    rows = {}
    for name, (q_lens, seq_lens) in cases.items():
        n = len(q_lens)
        qsl = torch.tensor([0] + list(torch.tensor(q_lens).cumsum(0)), dtype=torch.int32)
        seq = torch.tensor(seq_lens, dtype=torch.int32)
        bt = (torch.arange(n * mbr, dtype=torch.int32) % (1024 * mbr)).view(n, mbr)
        rows[name] = measure(lambda: builder.build(qsl, seq, bt), [lambda md: None], iters)["build_us"]
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--iters", type=int, default=200, help="timed steps per case (default 200, after 5 warm-up)")
    ap.add_argument("--out", default="benchmarks/results/step.json", help="JSON report ('-': none)")
    ap.add_argument("--only", choices=("v32", "v4", "builds"), default=None)
    ap.add_argument("--sizes", default="256,32", help="decode batch sizes (default 256,32)")
    ap.add_argument("--v4-layers", default=V4_DEFAULT_MIX,
                    help=f"V4 layer mix as ratio:count,... (default {V4_DEFAULT_MIX}: an assumption)")
    ap.add_argument("--v4-device", choices=("meta", "cpu"), default="meta",
                    help="device of the V4 builders' buffers, caches, weights and hidden states (default meta: shapes "
                         "only, as the V3.2 stack; cpu: the single-rank setting of bench_dsa_cp.py)")
    args = ap.parse_args()
    sizes = tuple(int(s) for s in args.sizes.split(","))
    mix = parse_mix(args.v4_layers)
    torch.set_num_threads(1)
    aar.set_provider("no_compute")
    report = {"benchmark": "decode_step_host", "provider": "no_compute", "iters": args.iters, "warmup": WARMUP,
              "threads": torch.get_num_threads(), "torch": torch.__version__, "cpu_count": os.cpu_count(),
              "machine": platform.processor() or platform.machine(), "figures": "medians, us"}
    try:
        with torch.inference_mode():
            if args.only in (None, "v32"):
                report["v32"] = {"what": f"sfa.MetadataBuilder.build (host block table) + {V32_LAYERS} indexer-layer "
                                         "sfa.Impl.forward, meta tensors",
                                 "rows": bench_v32(sizes, args.iters)}
            if args.only in (None, "v4"):
                report["v4"] = {"what": "dsa.StepBuilder.build + 7 GroupBuilder.build (host tables) + route_layer x 3 "
                                        "+ the layer mix's dsa.Impl.forward",
                                "layer_mix": args.v4_layers, "device": args.v4_device,
                                "rows": bench_v4(sizes, args.iters, mix, args.v4_device)}
            if args.only in (None, "builds"):
                report["builds"] = {"what": "the step's builds alone (V3.2: sfa.MetadataBuilder.build; V4: "
                                            "StepBuilder.build + 7 GroupBuilder.build + route_layer x 3), host tables, "
                                            "upstream's build cases",
                                    "v32_build_us": bench_v32_builds(args.iters),
                                    "v4_build_us": bench_v4_builds(args.iters, args.v4_device)}
    finally:
        aar.set_provider("auto")
    print(f"Decode step host time, provider no_compute, torch threads {report['threads']}, us (median of {args.iters})")
    for model in ("v32", "v4"):
        if model not in report:
            continue
        for key, r in report[model]["rows"].items():
            extra = ""
            if "forward_us_by_kind" in r:
                extra = " (" + ", ".join(f"{k} {v:.2f}" for k, v in r["forward_us_by_kind"].items()) + ")"
            print(f"{model:4s} {key:11s} step {r['step_us']:9.2f} = build {r['build_us']:7.2f} + {r['layers']} "
                  f"layers {r['forwards_us']:9.2f} ({r['per_layer_us']:.3f} / layer){extra}")
            if "staged_tables" in r:
                t = r["staged_tables"]
                print(f"{model:4s} {key:11s} step {t['step_us']:9.2f} = build {t['build_us']:7.2f} + {r['layers']} "
                      f"layers {t['forwards_us']:9.2f} (tables in the builders' staging rows)")
    if "builds" in report:
        for model in ("v32", "v4"):
            print(f"{model:4s} build only: " + ", ".join(f"{k} {v:.2f}" for k, v in
                                                         report["builds"][f"{model}_build_us"].items()))
    if args.out != "-":
        p = pathlib.Path(args.out)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
