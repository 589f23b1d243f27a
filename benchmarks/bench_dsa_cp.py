"""Host time of a DSA (DeepSeek-V4) decode step under DSA-CP 2 token sharding (docs/design/sparse_cp.md §10), DCP 2
(§12), DSA-CP 2 x DCP 2 (§14) and PCP 2 (§13) beside the single-rank DSA step of the same shapes, operator provider "no_compute" (kernels
return correctly shaped outputs at once), bf16, the A2 plan.

Per step: aar.dsa.StepBuilder.build once, the seven KV-cache groups' GroupBuilder.build (SWA, C4 KV, C128 KV, C4
indexer K, C4 attention state, C4 indexer state, C128 state: a V4 model's groups), aar.dsa.route_layer for ratios 1,
4 and 128 (the "build" figure), then Impl.forward of one layer of each ratio: SWA (1), C4 with its indexer top-k (4),
C128 (128) (the "forward" figure is their sum; each layer's is reported too). Decode batches of 32 and 256 requests
at 4000-token contexts (block size 128; each group's table has the columns a 4000-token request needs, and its ids
cycle over a pool of 64 cache blocks: nothing is computed, so requests may share blocks). Shapes: DeepSeek-V4-like at
TP 8 (an assumption, as build/bench_dsa_impl_cpp's): hidden 7168, 16 heads x 512 (RoPE 64), q-LoRA 1536, window 128,
indexer 64 x 128 with top-k 512, 2 o_proj groups of rank 1024. DSA-CP: the StepBuilder with dsa_cp_world_size=2,
dsa_cp_rank=r, every layer with dsa_cp_comm=cp.Comm(group) and its o_proj shard (wo_a's group r, wo_b's matching
columns; every head's query weights); its decode road issues an all-to-all (head blocks) and an all-reduce (o_proj
partials) per layer, counted per layer-step, their wall time (cp.Comm.collective_ns) subtracted. DSA-CP 2 x DCP 2
(§14): both StepBuilder parts over the one group (same size and rank), every layer with dsa_cp_comm and dcp_comm the
same Comm and the DSA-CP weights; per layer the query gather, the C4 layer's top-k gather, the partials' token-block
all-to-all, then the decode road's all-to-all and all-reduce. DCP 2: the
StepBuilder with dcp_world_size=2, dcp_rank=r, every layer with dcp_comm and the single rank's weights (the DCP group
lies inside TP, a rank keeps its TP heads): a query all-gather and a partials all-to-all per layer. PCP 2: the
StepBuilder with pcp_world_size=2, pcp_rank=r, every layer with pcp_comm and the single rank's weights; a decode batch
is every rank's rows. Single rank: the same builders and layers without context parallelism, in the same process, on
the same inputs. Medians over --iters steps (after
5 warm-up steps), the modes and the single rank of one batch size run in turns of 25 steps
(cpb.measure_interleaved: a change of machine speed falls on all of them alike), torch.set_num_threads(1), garbage
collector off while timing, under torch.inference_mode() (benchmarks/_cp_bench.py). The provider is set back to "auto" afterwards.

Tensors are on the CPU (gloo's collectives need storage): the ATen glue around the kernels (the slice's views, the
head-block exchange's staging, the o_proj partials) runs on the CPU here, where on the NPU it is launched to the
device.

--fake-group: one process as rank 0 of torch's in-process fake 2-rank group (every collective returns at once, no
data moves), so the figure is the host work alone, without gloo's threads competing for the cores.

Run from the repository root:
  PYTHONPATH=python .venv/bin/python benchmarks/bench_dsa_cp.py [--iters N] [--out FILE] [--fake-group]
"""

import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _cp_bench as cpb  # noqa: E402

WORLD = 2
SIZES = (32, 256)                   # decode requests per step
SEQ = 4000                          # context length of every request (the new token included)
CBS, POOL, MAXPOS = 128, 64, 8192   # cache block size, cache blocks per group (ids cycle), RoPE table rows
HID, N, D, R, Q, WIN = 7168, 16, 512, 64, 1536, 128
NI, DI, K, G, OL = 64, 128, 512, 2, 1024
RATIOS = (1, 4, 128)
LAYER_NAMES = {1: "swa", 4: "c4_indexer", 128: "c128"}
MODES = (("dsa_cp2", "dsa_cp"), ("dcp2", "dcp"), ("dsa_cp2_dcp2", "dsa_cp_dcp"), ("pcp2", "pcp"))
KINDS = ("swa", "c4_kv", "c128_kv", "c4_indexer_k", "c4_attn_state", "c4_indexer_state", "c128_state")
WARMUP = 5
DT = torch.bfloat16
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32, "int8": torch.int8,
          "float8_e4m3fn": torch.float8_e4m3fn}


def _weights(ratio, world=1, rank=0):
    """One layer's weights (zeros); with world > 1 its o_proj is rank `rank`'s shard."""
    def w(*shape, dtype=DT):
        return torch.zeros(*shape, dtype=dtype)

    ws = dict(wq_a=w(Q, HID), q_norm=w(Q), wq_b=w(N * D, Q), wkv=w(D, HID), kv_norm=w(D),
              attn_sink=w(N, dtype=torch.float32), wo_a=w(G // world, N * D // G, OL), wo_b=w(HID, G // world * OL))
    if ratio > 1:
        coff = 2 if ratio == 4 else 1
        ws.update(cmp_wkv=w(coff * D, HID), cmp_wgate=w(coff * D, HID), cmp_ape=w(ratio, coff * D), cmp_norm=w(D))
    if ratio == 4:
        ws.update(idx_wq_b=w(NI * DI, Q), idx_weights_proj=w(NI, HID), idx_cmp_wkv=w(2 * DI, HID),
                  idx_cmp_wgate=w(2 * DI, HID), idx_cmp_ape=w(4, 2 * DI), idx_cmp_norm=w(DI))
    return ws


def _caches(groups):
    """Every group's cache from its cache_spec (the A2 plan: plain bf16 rows, int8 indexer keys with fp16 scales)."""
    c = {}
    for kd, gb in groups.items():
        sp = gb.cache_spec
        c[kd] = torch.zeros(sp["shape"], dtype=DTYPES[sp["dtype"]])
        if kd == "c4_indexer_k":
            c["c4_indexer_scale"] = torch.zeros(sp["scale_shape"], dtype=DTYPES[sp["scale_dtype"]])
    return c


def _kv(aar, ratio, c):
    kw = {}
    if ratio == 4:
        kw = dict(compress_kv=c["c4_kv"], state=c["c4_attn_state"], indexer_state=c["c4_indexer_state"],
                  indexer_k=c["c4_indexer_k"], indexer_scale=c["c4_indexer_scale"])
    elif ratio == 128:
        kw = dict(compress_kv=c["c128_kv"], state=c["c128_state"])
    return aar.dsa.compose_kv_cache(swa_kv=c["swa"], **kw)


class _Model:
    """The step builder, the seven group builders, their caches and one layer per ratio. mode: None (single rank),
    "dsa_cp" (token sharding, the layer's o_proj shard), "dcp" or "pcp" (the KV sharded over the group, the rank's
    TP heads as the single rank's: the DCP / PCP group lies inside TP)."""

    def __init__(self, aar, rope, world=1, rank=0, comm=None, mode=None):
        cos, sin = rope
        cp = {None: {}, "dsa_cp": dict(dsa_cp_world_size=world, dsa_cp_rank=rank),
              "dcp": dict(dcp_world_size=world, dcp_rank=rank), "pcp": dict(pcp_world_size=world, pcp_rank=rank),
              "dsa_cp_dcp": dict(dsa_cp_world_size=world, dsa_cp_rank=rank, dcp_world_size=world,
                                 dcp_rank=rank)}[mode]
        self.aar = aar
        self.sb = aar.dsa.StepBuilder(max_num_reqs=max(SIZES), max_num_tokens=4096, cos_table=cos, sin_table=sin,
                                      compress_cos_table=cos, compress_sin_table=sin, head_dim=D, window=WIN,
                                      num_heads_q=N, index_topk=K, index_n_heads=NI, index_head_dim=DI, **cp)
        self.gb, self.cols = {}, {}
        for kd in KINDS:
            probe = aar.dsa.GroupBuilder(self.sb, kind=kd, cache_block_size=CBS, num_blocks=POOL)
            cols = -(-SEQ // probe.block_size)
            self.cols[kd] = cols
            self.gb[kd] = aar.dsa.GroupBuilder(self.sb, kind=kd, cache_block_size=CBS, max_blocks_per_req=cols,
                                               num_blocks=POOL)
        self.caches = _caches(self.gb)
        self.kv = {r: _kv(aar, r, self.caches) for r in RATIOS}
        kw = {None: {}, "dsa_cp": dict(dsa_cp_comm=comm), "dcp": dict(dcp_comm=comm), "pcp": dict(pcp_comm=comm),
              "dsa_cp_dcp": dict(dsa_cp_comm=comm, dcp_comm=comm)}[mode]
        shard = mode in ("dsa_cp", "dsa_cp_dcp")
        self.layers = {r: aar.dsa.Impl(_weights(r, world if shard else 1, rank), hidden_size=HID,
                                       num_heads=N, head_dim=D, rope_dim=R, q_lora_rank=Q, compress_ratio=r,
                                       index_n_heads=NI, index_head_dim=DI, index_topk=K, o_groups=G,
                                       o_lora_rank=OL, **kw)
                       for r in RATIOS}

    def case(self, n, comm=None):
        """(build, forwards, comm) of one decode step of n requests, for cpb.measure_interleaved."""
        aar = self.aar
        qsl = torch.arange(n + 1, dtype=torch.int32)
        seq = torch.full((n,), SEQ, dtype=torch.int32)
        tables = {kd: (torch.arange(n * c, dtype=torch.int32) % POOL).view(n, c) for kd, c in self.cols.items()}
        x = torch.zeros(n, HID, dtype=DT)
        out = torch.empty_like(x)

        def build():
            st = self.sb.build(qsl, seq)
            md = {kd: gb.build(st, tables[kd]) for kd, gb in self.gb.items()}
            return {r: aar.dsa.route_layer(r, st, md) for r in RATIOS}

        def fwd(r):
            layer, kv = self.layers[r], self.kv[r]
            return lambda routed: layer.forward(x, kv, routed[r], out)

        return build, [(LAYER_NAMES[r], fwd(r)) for r in RATIOS], comm


def _rope():
    inv = 10000.0 ** (-torch.arange(0, R, 2, dtype=torch.float64) / R)
    a = torch.arange(MAXPOS, dtype=torch.float64)[:, None] * inv
    return torch.cat([a.cos(), a.cos()], -1).to(DT), torch.cat([a.sin(), a.sin()], -1).to(DT)


def _bench(rank, iters):
    import ascend_attn_rt as aar

    torch.set_num_threads(1)
    aar.set_provider("no_compute")
    try:
        comm = aar.cp.Comm(torch.distributed.group.WORLD, timeout_s=30.0)
        rope = _rope()
        rows = {}
        with torch.inference_mode():
            models = {mode: _Model(aar, rope, WORLD, rank, comm, name) for mode, name in MODES}
            one = _Model(aar, rope)
            for n in SIZES:
                cases = {mode: m.case(n, comm) for mode, m in models.items()}
                cases["single_rank"] = one.case(n)
                got = cpb.measure_interleaved(cases, iters, WARMUP)
                s = got["single_rank"]
                row = dict(got)
                for mode, name in MODES:
                    d = got[mode]
                    row[f"ratio_{name}_over_single"] = cpb.ratio(d["step_us"], s["step_us"])
                    row[f"build_ratio_{name}"] = cpb.ratio(d["build_us"], s["build_us"])
                    row[f"forward_ratio_{name}"] = cpb.ratio(d["forward_us"], s["forward_us"])
                    for lname, lr in d["layers"].items():
                        row[f"forward_ratio_{name}_{lname}"] = cpb.ratio(lr["forward_us"],
                                                                          s["layers"][lname]["forward_us"])
                rows[f"decode_{n}"] = row
    finally:
        aar.set_provider("auto")
    return rows


def main():
    args, got, group = cpb.parse_and_run(__doc__.split("\n\n")[0], _bench, WORLD, "aar_bench_dsa_cp_")
    report = {
        "benchmark": "dsa_cp_decode_host",
        "group": group,
        "provider": "no_compute",
        "device": "cpu",
        "dtype": "bfloat16",
        "plan": "a2",
        "step": "StepBuilder.build + 7 GroupBuilder.build + route_layer x 3 (build), Impl.forward of one SWA, one "
                "C4 + indexer and one C128 layer (forward; collectives' wall time subtracted)",
        "shapes": {"hidden_size": HID, "num_heads": N, "head_dim": D, "rope_dim": R, "q_lora_rank": Q,
                   "window": WIN, "index_n_heads": NI, "index_head_dim": DI, "index_topk": K, "o_groups": G,
                   "o_lora_rank": OL, "cache_block_size": CBS, "cache_blocks_per_group": POOL, "seq_len": SEQ},
        "dsa_cp_world": WORLD,
        "iters": args.iters,
        "warmup": WARMUP,
        "threads": 1,
        "torch": torch.__version__,
        "target_ratio_over_single": 1.5,
        "ranks": {str(r): got[r] for r in sorted(got)},
    }
    cpb.write_report(args.out, report)
    print(f"DSA decode step host time, {report['group']}, provider no_compute, us (median of {args.iters})")
    for r in sorted(got):
        for key, row in got[r].items():
            for mode in ("single_rank",) + tuple(m for m, _ in MODES):
                d = row[mode]
                layers = ", ".join(f"{k} {v['forward_us']:.1f}" for k, v in d["layers"].items())
                print(f"rank {r} {key:10s} {mode:11s} build {d['build_us']:7.1f} + fwd {d['forward_us']:8.1f}"
                      f" = {d['step_us']:8.1f} ({layers})")
                if mode == "single_rank":
                    continue
                for k, v in d["layers"].items():
                    print(f"    {k:10s} {cpb.collectives_text(v)}")
                name = dict(MODES)[mode]
                print(f"    ratio step {row['ratio_' + name + '_over_single']:.2f}x, build"
                      f" {row['build_ratio_' + name]:.2f}x, forward {row['forward_ratio_' + name]:.2f}x"
                      f" (target <= 1.5x)")


if __name__ == "__main__":
    main()
