"""Host-time benchmark of ascend_attn_rt through the Python facade.

Measures what a Python serving engine pays per step on the host: one
``MetadataBuilder.build`` per step and one ``AttentionImpl.forward`` per layer.
The operator provider is set to "no_compute" (the kernels return at once with
correctly shaped outputs), so the numbers are host work only: Python -> C++
call, validation, planning, staging, path choice and operator dispatch. The
provider is restored to "auto" at the end.

Cases
  build    decode-only batches of 1/32/256/1024 requests at 2048 context, block
           size 128 (16 blocks per request); mixed (64 decodes + 4 prefills of
           512 new tokens on 1024 context); prefill (8 x 2048 new tokens,
           PrefillNoCache). Each with the block table in the builder's staging
           buffer (``block_table_staging[:B]``, zero copy) and in a separately
           allocated tensor (copied into staging by the build).
  forward  decode batches of 1/32/256 with Llama-3-8B attention shapes (32 query
           heads, 8 KV heads, head size 128, block size 128, bf16, 2048 context),
           on the fused-kernel path (default impl) and on the paged-attention
           path (full_decode_only_graph=True, pa_shape_list=[B]); the KV-cache
           write is included (key/value passed). Nothing is computed, so the
           requests share a pool of 512 cache blocks (block ids repeat across
           requests), which keeps the caches at 128 MiB each.

Timing: time.perf_counter_ns around a loop of n calls (n calibrated to about
--target-ms per repeat, within [--min-iters, --max-iters]), --repeats repeats
interleaved between the variants compared (staging/separate table, fused/paged
path), garbage collector off; the reported figure is the median over repeats of
the per-call mean, in microseconds (min over repeats alongside).

Run: PYTHONPATH=python .venv/bin/python -m ascend_attn_rt bench [--quick] [--out FILE]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import time
from typing import Callable, Dict, List, Optional

import torch

import ascend_attn_rt as aar

DEFAULT_OUT = os.path.join("benchmarks", "results", "python_host.json")

BLOCK_SIZE = 128
CONTEXT = 2048
BLOCKS_PER_REQ = CONTEXT // BLOCK_SIZE  # 16
# Llama-3-8B attention
N_HEADS, N_KV_HEADS, HEAD_SIZE = 32, 8, 128
FORWARD_POOL_BLOCKS = 512  # shared by all requests in the forward cases (no compute)


# --------------------------------------------------------------------------- timing


def time_calls(fns: Dict[str, Callable[[], object]], *, repeats: int, target_ms: float, min_iters: int,
               max_iters: int) -> Dict[str, Dict]:
    """Per-call time of each function, in microseconds: median over `repeats` of the loop mean.

    The functions' repeats are interleaved (a, b, a, b, ...), so a transient
    load on the machine hits the variants being compared alike.
    """
    iters = {}
    for name, fn in fns.items():
        for _ in range(20):  # warm up (first-call allocations, caches)
            fn()
        probe = 50
        t0 = time.perf_counter_ns()
        for _ in range(probe):
            fn()
        per_call_ns = max(1, (time.perf_counter_ns() - t0) // probe)
        iters[name] = int(min(max_iters, max(min_iters, target_ms * 1e6 / per_call_ns)))
    samples: Dict[str, List[float]] = {name: [] for name in fns}
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        for _ in range(repeats):
            for name, fn in fns.items():
                n = iters[name]
                t0 = time.perf_counter_ns()
                for _ in range(n):
                    fn()
                samples[name].append((time.perf_counter_ns() - t0) / n / 1e3)
    finally:
        if gc_was_enabled:
            gc.enable()
    return {
        name: {
            "median_us": statistics.median(xs),
            "min_us": min(xs),
            "iters": iters[name],
            "repeats": repeats,
            "samples_us": [round(x, 4) for x in xs],
        }
        for name, xs in samples.items()
    }


# --------------------------------------------------------------------------- build cases


def _i32(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32)


def _batch(q_lens: List[int], seq_lens: List[int]):
    qsl = torch.zeros(len(q_lens) + 1, dtype=torch.int32)
    qsl[1:] = torch.cumsum(_i32(q_lens), 0)
    return qsl, _i32(seq_lens)


def _block_ids(num_reqs: int, blocks_per_req: int, pool: Optional[int] = None) -> torch.Tensor:
    """(num_reqs, blocks_per_req) int32 block ids starting at 1 (block 0 is the dummy block);
    with `pool`, ids wrap around within [1, pool] (shared blocks)."""
    ids = torch.arange(num_reqs * blocks_per_req, dtype=torch.int64)
    if pool is not None:
        ids = ids % pool
    return (ids + 1).to(torch.int32).reshape(num_reqs, blocks_per_req)


def build_cases():
    """(name, q_lens, seq_lens, expected state name)."""
    cases = []
    for b in (1, 32, 256, 1024):
        cases.append((f"decode B={b} ctx={CONTEXT}", [1] * b, [CONTEXT] * b, "DecodeOnly"))
    cases.append(
        ("mixed 64 dec + 4x512 prefill ctx=1024", [1] * 64 + [512] * 4, [1025] * 64 + [1024 + 512] * 4,
         "ChunkedPrefill")
    )
    cases.append(("prefill 8x2048 new", [2048] * 8, [2048] * 8, "PrefillNoCache"))
    return cases


def bench_build(timing: Dict, verbose: bool) -> List[Dict]:
    results = []
    for name, q_lens, seq_lens, want_state in build_cases():
        b = len(q_lens)
        tokens = sum(q_lens)
        num_blocks = b * BLOCKS_PER_REQ + 1
        builder = aar.MetadataBuilder(
            max_num_reqs=1024, max_num_tokens=max(16384, tokens), max_blocks_per_req=BLOCKS_PER_REQ,
            block_size=BLOCK_SIZE, num_blocks=num_blocks,
        )
        qsl, sl = _batch(q_lens, seq_lens)
        ids = _block_ids(b, BLOCKS_PER_REQ)
        staged = builder.block_table_staging[:b]  # the engine keeps its table here: zero copy
        staged.copy_(ids)
        separate = ids.clone()  # an engine-owned table: the build copies it into staging
        tables = {"staging": staged, "separate": separate}
        for table in tables.values():
            state = str(builder.build(qsl, sl, table).attn_state).rsplit(".", 1)[-1]
            if state != want_state:
                raise RuntimeError(f"{name}: expected state {want_state}, builder derived {state}")
        build = builder.build
        timed = time_calls({kind: (lambda t=t: build(qsl, sl, t)) for kind, t in tables.items()}, **timing)
        for table_kind, r in timed.items():
            r.update(kind="build", case=name, block_table=table_kind, num_reqs=b, num_tokens=tokens,
                     attn_state=state)
            results.append(r)
            if verbose:
                print(f"  build  {name:<40} {table_kind:<9} {r['median_us']:9.2f} us", file=sys.stderr)
    return results


# --------------------------------------------------------------------------- forward cases


def bench_forward(timing: Dict, verbose: bool, batches=(1, 32, 256)) -> List[Dict]:
    results = []
    dtype = torch.bfloat16
    num_blocks = FORWARD_POOL_BLOCKS + 1
    key_cache = torch.zeros(num_blocks, BLOCK_SIZE, N_KV_HEADS, HEAD_SIZE, dtype=dtype)
    value_cache = torch.zeros_like(key_cache)
    for b in batches:
        builder = aar.MetadataBuilder(
            max_num_reqs=max(batches), max_num_tokens=max(batches), max_blocks_per_req=BLOCKS_PER_REQ,
            block_size=BLOCK_SIZE, num_blocks=num_blocks,
        )
        qsl, sl = _batch([1] * b, [CONTEXT] * b)
        table = builder.block_table_staging[:b]
        table.copy_(_block_ids(b, BLOCKS_PER_REQ, pool=FORWARD_POOL_BLOCKS))
        md = builder.build(qsl, sl, table)
        q = torch.zeros(b, N_HEADS, HEAD_SIZE, dtype=dtype)
        k = torch.zeros(b, N_KV_HEADS, HEAD_SIZE, dtype=dtype)
        v = torch.zeros(b, N_KV_HEADS, HEAD_SIZE, dtype=dtype)
        out = torch.empty(b, N_HEADS, HEAD_SIZE, dtype=dtype)
        impls = (
            ("fused", aar.AttentionImpl(N_HEADS, HEAD_SIZE, num_kv_heads=N_KV_HEADS), "fused_paged"),
            ("paged_attention",
             aar.AttentionImpl(N_HEADS, HEAD_SIZE, num_kv_heads=N_KV_HEADS, full_decode_only_graph=True,
                               pa_shape_list=[b]),
             "paged_attention"),
        )
        for impl_name, impl, want_path in impls:
            impl.forward(q, k, v, key_cache, value_cache, md, out)
            if impl.last_path != want_path:
                raise RuntimeError(f"forward B={b} {impl_name}: expected path {want_path}, took {impl.last_path}")
        timed = time_calls(
            {name: (lambda f=impl.forward: f(q, k, v, key_cache, value_cache, md, out)) for name, impl, _ in impls},
            **timing)
        for impl_name, impl, _ in impls:
            r = timed[impl_name]
            r.update(kind="forward", case=f"decode B={b} ctx={CONTEXT}", impl=impl_name, path=impl.last_path,
                     num_reqs=b, dtype="bfloat16", kv_write=True)
            results.append(r)
            if verbose:
                print(f"  forward decode B={b:<5} {impl_name:<16} {r['median_us']:9.2f} us", file=sys.stderr)
    return results


def bench_graph(timing: Dict, verbose: bool, batches=(1, 32, 256), layer_counts=(32, 61)) -> List[Dict]:
    """Graph mode: per-step GraphParams.update (every captured attention call of the
    bucket re-issued with the step's lists) through the facade, with no-op graph
    hooks ("noop" provider) and the no_compute operator provider; and a whole step
    = build + update."""
    results = []
    dtype = torch.bfloat16
    num_blocks = BLOCKS_PER_REQ + 1  # ids 1..16 shared by every request (nothing is computed)
    key_cache = torch.zeros(num_blocks, BLOCK_SIZE, N_KV_HEADS, HEAD_SIZE, dtype=dtype)
    value_cache = torch.zeros_like(key_cache)
    for paged in (False, True):
        for layers in layer_counts:
            for b in batches:
                builder = aar.MetadataBuilder(max_num_reqs=max(batches), max_num_tokens=max(batches),
                                              max_blocks_per_req=BLOCKS_PER_REQ, block_size=BLOCK_SIZE,
                                              num_blocks=num_blocks)
                qsl, sl = _batch([1] * b, [CONTEXT] * b)
                table = builder.block_table_staging[:b]
                table.copy_(_block_ids(b, BLOCKS_PER_REQ, pool=BLOCKS_PER_REQ))
                q = torch.zeros(b, N_HEADS, HEAD_SIZE, dtype=dtype)
                k = torch.zeros(b, N_KV_HEADS, HEAD_SIZE, dtype=dtype)
                v = torch.zeros(b, N_KV_HEADS, HEAD_SIZE, dtype=dtype)
                out = torch.zeros(b, N_HEADS, HEAD_SIZE, dtype=dtype)
                extra = dict(full_decode_only_graph=True, pa_shape_list=[b]) if paged else {}
                impls = [aar.AttentionImpl(N_HEADS, HEAD_SIZE, num_kv_heads=N_KV_HEADS, layer_index=i, **extra)
                         for i in range(layers)]
                g = aar.GraphParams("noop")
                md = builder.build_for_graph_capture(qsl, sl, table)
                with g.capture(b):
                    for impl in impls:
                        impl.forward(q, k, v, key_cache, value_cache, md, out)
                path = impls[-1].last_path
                # Timed apart: a build makes the previous metadata stale, so the
                # update-only loop must not see the step loop's builds.
                md = builder.build(qsl, sl, table)
                timed = time_calls({"update": lambda: g.update(b, md)}, **timing)
                timed.update(time_calls({"step": lambda: g.update(b, builder.build(qsl, sl, table))}, **timing))
                r = timed["update"]
                r.update(kind="graph", case=f"decode B={b}", path=path, layers=layers, num_reqs=b,
                         per_layer_us=r["median_us"] / layers,
                         build_plus_update_us=timed["step"]["median_us"])
                results.append(r)
                if verbose:
                    print(f"  graph {path:<16} L={layers:<3} B={b:<4} update {r['median_us']:8.2f} us "
                          f"({r['per_layer_us']:.3f}/layer), build+update {r['build_plus_update_us']:8.2f} us",
                          file=sys.stderr)
    return results


def bench_floor(timing: Dict) -> Dict:
    """The cheapest call through the facade (a property read), for scale."""
    r = time_calls({"floor": aar.get_provider}, **timing)["floor"]
    r.update(kind="floor", case="aar.get_provider() (facade call floor)")
    return r


# --------------------------------------------------------------------------- report


def machine_info() -> Dict:
    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {
        "cpu_count": os.cpu_count(),
        "cpu_affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "cpu_model": model or platform.processor(),
        "torch_version": torch.__version__,
        "torch_num_threads": torch.get_num_threads(),
        "python_version": platform.python_version(),
        "platform": platform.platform(),
        "ascend_attn_rt_version": getattr(aar, "__version__", "?"),
    }


def format_table(results: List[Dict]) -> str:
    lines = []
    build = [r for r in results if r["kind"] == "build"]
    if build:
        lines.append("MetadataBuilder.build (per step), provider no_compute")
        lines.append(f"  {'case':<40} {'block table':<11} {'median us':>10} {'min us':>9} {'iters':>7}")
        for r in build:
            lines.append(f"  {r['case']:<40} {r['block_table']:<11} {r['median_us']:10.2f} {r['min_us']:9.2f} "
                         f"{r['iters']:7d}")
    fwd = [r for r in results if r["kind"] == "forward"]
    if fwd:
        lines.append("")
        lines.append("AttentionImpl.forward (per layer, KV write included), Llama-3-8B shapes, bf16, no_compute")
        lines.append(f"  {'case':<22} {'path':<16} {'median us':>10} {'min us':>9} {'iters':>7}")
        for r in fwd:
            lines.append(f"  {r['case']:<22} {r['path']:<16} {r['median_us']:10.2f} {r['min_us']:9.2f} "
                         f"{r['iters']:7d}")
    graph = [r for r in results if r["kind"] == "graph"]
    if graph:
        lines.append("")
        lines.append("GraphParams.update (per step; noop graph hooks, no_compute), Llama-3-8B shapes, bf16")
        lines.append(f"  {'path':<16} {'layers':>6} {'batch':>6} {'update us':>10} {'per layer us':>13} "
                     f"{'build+update us':>16}")
        for r in graph:
            lines.append(f"  {r['path']:<16} {r['layers']:6d} {r['num_reqs']:6d} {r['median_us']:10.2f} "
                         f"{r['per_layer_us']:13.3f} {r['build_plus_update_us']:16.2f}")
    floor = [r for r in results if r["kind"] == "floor"]
    for r in floor:
        lines.append("")
        lines.append(f"  {r['case']}: {r['median_us']:.3f} us")
    return "\n".join(lines)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", default=DEFAULT_OUT, help=f"JSON results file (default {DEFAULT_OUT}); '-' for none")
    p.add_argument("--only", choices=("build", "forward", "graph"), default=None, help="run one group only")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--target-ms", type=float, default=100.0, help="time per repeat used to size the loop")
    p.add_argument("--min-iters", type=int, default=2000)
    p.add_argument("--max-iters", type=int, default=20000)
    p.add_argument("--quick", action="store_true", help="3 repeats of ~20 ms, at least 200 iterations (smoke run)")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1; 0: torch default)")
    p.add_argument("-v", "--verbose", action="store_true", help="print each case as it finishes")


def run(args: argparse.Namespace) -> int:
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    timing = dict(repeats=args.repeats, target_ms=args.target_ms, min_iters=args.min_iters, max_iters=args.max_iters)
    if args.quick:
        timing = dict(repeats=3, target_ms=20.0, min_iters=200, max_iters=5000)

    results: List[Dict] = []
    previous = aar.get_provider()
    aar.set_provider("no_compute")
    t0 = time.perf_counter()
    try:
        with torch.inference_mode():
            if args.only in (None, "build"):
                results += bench_build(timing, args.verbose)
            if args.only in (None, "forward"):
                results += bench_forward(timing, args.verbose)
            if args.only in (None, "graph"):
                results += bench_graph(timing, args.verbose)
            results.append(bench_floor(timing))
    finally:
        aar.set_provider("auto")
    elapsed = time.perf_counter() - t0

    print(format_table(results))
    report = {
        "benchmark": "python_host",
        "provider": "no_compute",
        "provider_before": previous,
        "timing": timing,
        "elapsed_s": round(elapsed, 2),
        "machine": machine_info(),
        "results": results,
    }
    if args.out and args.out != "-":
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(report, f, indent=2)
        print(f"\nwrote {args.out} ({elapsed:.1f} s)")
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ascend_attn_rt bench",
                                description="Host-time benchmark through the Python facade (no_compute provider).")
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
