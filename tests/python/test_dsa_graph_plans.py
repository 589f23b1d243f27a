# Graph capture of the DSA paths beyond the A2 bf16 layer (docs/design/dsa.md §6): the MX-fp8 o_proj (A5 fp8
# plan), the W8A8-dynamic prolog, the A5 + BF16 (SparseFlashMla) plan with its full-width in-place KV write, and
# the multistream prolog. Each: a decode bucket captured once (the CPU recording provider runs nothing), then
# replayed for several steps with other seq_lens, request orders and fewer real requests than the bucket (dummy
# requests pad it); every replay against a twin layer stepped eagerly on the same steps and against the path's
# own float64 reference, with the tolerance its eager test derives and states:
#  - MX-fp8 o_proj: test_dsa_a5.py MX_TOL (the MX o_proj's model, measured there) around test_dsa_a5.mx_o_proj
#    over the attention of the rows decoded from the A5 caches;
#  - W8A8-dynamic: test_dsa_w8a8.py (float32 inputs whose quantisation codes clear the tie margins, so the float32
#    layer tolerance holds; bf16 keeps the bf16 tolerance);
#  - A5 + BF16 and multistream: the float layer tolerances of test_dsa.py (2e-5 fp32, 3e-2 bf16).
# The replays run the same operators on the same rows as the eager twin; they are compared to it at the
# reference tolerance, and the caches (blocks 1.. : block 0 is the dummies' null block) likewise.
import pytest
import torch

import ascend_attn_rt as aar
import _dsa_reference as ref
import test_dsa_a5 as a5t
import test_dsa_sfmla as sft
import test_dsa_w8a8 as w8t
from _dsa_harness import LayerRun
from test_dsa import dims, tol
from test_dsa_graph import Bucket, caches, same

F64 = torch.float64
STEPS = [[0, 1, 2], [2, 0], [1], [0, 1, 2], [1, 2, 0], [2], [0, 2, 1]]


def prefill_of(ratio):
    # near a compressed-row boundary so the compressors emit rows during the replays
    return {1: [13, 9, 20], 4: [22, 13, 30], 128: [125, 61, 126]}[ratio]


def run_bucket(run, twin, ratio, check, steps=STEPS, q=1):
    """Prefill both runs eagerly, capture a bucket of 4 x q over `run`, replay `steps`; each replay's real rows
    against the twin's eager step and `check(reqs, qlens, out, qsl, S)`; the caches against the twin's."""
    pf = prefill_of(ratio)
    run.step([0, 1, 2], pf)
    twin.step([0, 1, 2], pf)
    bk = Bucket(run, B=4, q=q)
    bk.capture([0, 1, 2])
    at, rt = tol(run.dtype)
    for reqs in steps:
        S, qsl = bk.replay(reqs)
        n = len(reqs) * q
        out = bk.outs[0]
        eager, _, _ = twin.step(reqs, [q] * len(reqs))
        scale = max(1.0, eager.abs().max().item())
        torch.testing.assert_close(out[:n], eager, atol=at * scale, rtol=rt)
        if ratio == 4:
            assert torch.equal(run.impl.last_topk[:n], twin.impl.last_topk)
        check(reqs, [q] * len(reqs), out, qsl, S)
        for a, b in zip(caches(run), caches(twin)):
            if a.element_size() == 1:
                assert same(a[1:], b[1:])
            else:
                torch.testing.assert_close(a[1:], b[1:], atol=at * 4, rtol=rt)
    return bk


# ---------------------------------------------------------------- 1. the MX-fp8 o_proj (A5 fp8 plan)

@pytest.mark.parametrize("ratio", [1, 128, 4], ids=["swa", "c128", "c4"])
def test_mx_o_proj_decode_bucket(ratio):
    d = a5t.dims(ratio)
    w = ref.make_dsa_weights(d, torch.bfloat16, torch.Generator().manual_seed(7))
    w_mx, w_ref = a5t.mx_weights(w)
    run = LayerRun(d, "a5", torch.bfloat16, 3, w=w_mx, seed=7)
    twin = LayerRun(d, "a5", torch.bfloat16, 3, w=w_mx, x=run.x)
    assert run.impl.o_proj == "MxFp8QuantBmm"

    def check(reqs, qlens, out, qsl, S):
        for i, b in enumerate(reqs):
            o5 = out[qsl[i]: qsl[i + 1]].to(F64)
            tk = run.impl.last_topk[qsl[i]: qsl[i + 1], 0].to(torch.int64) if ratio == 4 else None
            xs = run.x[b][: S[i]]
            o = a5t.ref_q_attn(d, w, xs, qlens[i], run.cos, run.sin, tk, *a5t.decoded_rows(run, b, S[i]))
            want_mx = a5t.mx_o_proj(d, w_ref, o)
            scale = max(1.0, want_mx.abs().max().item())
            assert float((o5 - want_mx).abs().max()) <= a5t.MX_TOL * scale

    run_bucket(run, twin, ratio, check, steps=STEPS[:5])


# ---------------------------------------------------------------- 2. the W8A8-dynamic prolog

# fp32 for every ratio, bf16 on the C4 layer (each case replays several steps; the CI budget)
CASES = pytest.mark.parametrize("ratio,dtype", [(1, torch.float32), (4, torch.float32), (128, torch.float32),
                                                (4, torch.bfloat16)], ids=["swa-fp32", "c4-fp32", "c128-fp32",
                                                                           "c4-bf16"])


@CASES
def test_w8a8_prolog_decode_bucket(ratio, dtype):
    d = dims(ratio, q_lora=16) if ratio == 128 else dims(ratio)
    tokens = max(prefill_of(ratio)) + len(STEPS)
    w, x = w8t.quantised_inputs(d, dtype, 3, tokens)
    run = LayerRun(d, "a2", dtype, 3, w=w, x=x)
    twin = LayerRun(d, "a2", dtype, 3, w=w, x=x)
    assert run.impl.w8a8_prolog

    def check(reqs, qlens, out, qsl, S):
        w8t.check(run, reqs, qlens, out, qsl, S)

    run_bucket(run, twin, ratio, check)


def test_w8a8_prolog_on_the_a5_bf16_plan_decode_bucket():
    d = dims(4)
    w, x = w8t.quantised_inputs(d, torch.float32, 3, max(prefill_of(4)) + len(STEPS), seed=3)
    run = LayerRun(d, "a5_bf16", torch.float32, 3, w=w, x=x)
    twin = LayerRun(d, "a5_bf16", torch.float32, 3, w=w, x=x)
    run_bucket(run, twin, 4, lambda reqs, qlens, out, qsl, S: w8t.check(run, reqs, qlens, out, qsl, S),
               steps=STEPS[:4])


def test_w8a8_prolog_on_the_a5_fp8_plan_decode_bucket():
    # The A5 fp8-row plan (kv_compress_epilog takes the prolog's bf16 kv rows): each replay against the float64
    # W8A8 layer over the rows decoded from the A5 caches within test_dsa_a5.py's OUT_TOL (its bf16 arithmetic
    # bound), as test_dsa_w8a8.test_w8a8_prolog_on_the_a5_fp8_row_plan checks the eager layer.
    d = a5t.dims(4)
    g = torch.Generator().manual_seed(11)
    w = ref.quantise_prolog(ref.make_dsa_weights(d, torch.bfloat16, g))
    run = LayerRun(d, "a5", torch.bfloat16, 3, w=w, seed=11)
    twin = LayerRun(d, "a5", torch.bfloat16, 3, w=w, x=run.x)
    assert run.impl.w8a8_prolog

    def check(reqs, qlens, out, qsl, S):
        for i, b in enumerate(reqs):
            o5 = out[qsl[i]: qsl[i + 1]].to(F64)
            tk = run.impl.last_topk[qsl[i]: qsl[i + 1], 0].to(torch.int64)
            want = a5t.ref_q_layer(d, w, run.x[b][: S[i]], qlens[i], run.cos, run.sin, tk,
                                   *a5t.decoded_rows(run, b, S[i]))
            assert float((o5 - want).abs().max()) <= a5t.OUT_TOL * max(1.0, want.abs().max().item())

    run_bucket(run, twin, 4, check, steps=STEPS[:4])


# ---------------------------------------------------------------- 3. the A5 + BF16 (SparseFlashMla) plan

def sfmla_check(run):
    def check(reqs, qlens, out, qsl, S):
        sft.check_step(run, reqs, qlens, out, qsl, S)
        for b in reqs:
            sft.check_caches(run, b)  # the rows, and nothing written past them
    return check


@CASES
def test_sfmla_plan_decode_bucket(ratio, dtype):
    d = dims(ratio)
    run = LayerRun(d, "a5_bf16", dtype, 3)
    twin = LayerRun(d, "a5_bf16", dtype, 3, w=run.w, x=run.x)
    run_bucket(run, twin, ratio, sfmla_check(run))


@pytest.mark.parametrize("ratio", [4, 128], ids=["c4", "c128"])
def test_sfmla_plan_spec_decode_bucket(ratio):
    d = dims(ratio)
    run = LayerRun(d, "a5_bf16", torch.float32, 3, k=1, seed=1)
    twin = LayerRun(d, "a5_bf16", torch.float32, 3, k=1, w=run.w, x=run.x)
    run_bucket(run, twin, ratio, sfmla_check(run), steps=STEPS[:5], q=2)


def test_sfmla_fill_slot_is_free_and_the_write_is_full_width():
    # The builder's fill slot is never a slot a valid row of the step writes; the replayed write is one in-place
    # scatter over every row of the bucket (no host row count), its skip rows sent to the fill slot.
    d = dims(128)
    run = LayerRun(d, "a5_bf16", torch.float32, 3)
    run.step([0, 1, 2], prefill_of(128))
    bk = Bucket(run, B=4, q=1)
    bk.capture([0, 1, 2])
    for reqs in ([0, 1, 2], [1]):
        st, md, S, qsl = bk.build(reqs)
        for kd in ("swa", "c128_kv"):
            g = md[kd]
            fill = g.graph_fill_slot
            assert fill.shape == (1, 2) and bool((fill >= 0).all())
            valid = g.slot_mapping[: g.num_valid_rows]
            assert not bool((valid == fill).all(1).any()), (kd, fill, valid)
        with sft.OpLog() as log:
            run.S = list(run.S)
            bk.replay(reqs)
        writes = log.named("npu_scatter_nd_update_")
        assert [a[1].shape[0] for a, _ in writes] == [4, 4]  # SWA: 4 tokens; C128: min(4, 4 // 128 + 4) rows
        for a, _ in writes:
            assert bool((a[1] >= 0).all())


# ---------------------------------------------------------------- 4. the multistream prolog

@pytest.mark.parametrize("ratio", [4, 128], ids=["c4", "c128"])
def test_multistream_decode_bucket(ratio):
    # The captured layer replays its two-stream order (the side stream's parts in the stream log); on CPU both
    # roles are the default stream, so replay == the serial eager twin bit for bit and == the reference.
    d = dims(ratio)
    run = LayerRun(d, "a2", torch.float32, 3, seed=7)
    run.impl = run.make_impl(multistream=True, log_streams=True)
    twin = LayerRun(d, "a2", torch.float32, 3, seed=7)

    def check_ms(reqs, qlens, out, qsl, S):
        parts = [(p, role) for p, role, _ in run.impl.stream_log]
        side = [p for p, role in parts if role == "side"]
        assert side == (["fork", "indexer_cache", "compressor"] if ratio == 4 else ["fork", "compressor"])
        assert ("wait_compressed_kv", "main") in parts
        sft.check_step(run, reqs, qlens, out, qsl, S)

    run_bucket(run, twin, ratio, check_ms, steps=STEPS[:4])


def test_mx_o_proj_capture_refused_with_float32_weights():
    # The MX o_proj's quantised bmm returns bf16 rows; a float32 layer (a CPU reference run on the A5 + BF16
    # plan) would cast them at a fresh address: refused by name at capture, nothing recorded or written.
    d = dims(1)
    w = ref.make_dsa_weights(d, torch.float32, torch.Generator().manual_seed(2))
    w_mx, _ = a5t.mx_weights(w)
    run = LayerRun(d, "a5_bf16", torch.float32, 3, w=w_mx)
    assert run.impl.o_proj == "MxFp8QuantBmm"
    run.step([0, 1, 2], [5, 6, 7])
    bk = Bucket(run, B=4, q=1)
    st, md, _, _ = bk.build([0, 1, 2], capture=True)
    snap = [t.clone() for t in caches(run)]
    with bk.g.capture(bk.n):
        with pytest.raises(NotImplementedError, match="MX-fp8 o_proj needs bfloat16 weights"):
            run.impl.forward(bk.hidden, run.kv, st, md["swa"], bk.outs[0])
    assert all(same(a, b) for a, b in zip(snap, caches(run)))
