"""MLA backend against the independent float64 reference (_mla_reference.py)."""

import math
from types import SimpleNamespace

import pytest
import torch

import ascend_attn_rt as aar
from _mla_reference import MlaDims, attend_request, fill_context, lse_merge, make_weights, rope_tables

mla = aar.mla


def _tol(dtype):
    return dict(atol=1e-4, rtol=1e-4) if dtype == torch.float32 else dict(atol=1e-2, rtol=1e-2)


def setup_case(seq_lens, q_lens, *, dims=None, dtype=torch.float32, bs=16, spec=0, prolog=False, workspace=0,
               seed=0, nz=False, **impl_kw):
    """A random MLA layer, ND caches holding every request's context (garbage elsewhere), the step's
    metadata and the float64 reference output; nothing run yet."""
    d = dims or MlaDims()
    g = torch.Generator().manual_seed(seed)
    ws = make_weights(d, dtype, g)
    B = len(seq_lens)
    per_req = [math.ceil(s / bs) for s in seq_lens]
    nb = sum(per_req) + 3
    perm = torch.randperm(nb, generator=g).tolist()
    mbr = max(per_req)
    table = torch.zeros(B, mbr, dtype=torch.int32)
    blocks, k = [], 0
    for r, n in enumerate(per_req):
        blocks.append(perm[k:k + n])
        table[r, :n] = torch.tensor(perm[k:k + n], dtype=torch.int32)
        k += n
    nope = torch.randn(nb, bs, 1, d.L, generator=g).to(dtype)  # garbage where unused
    rope = torch.randn(nb, bs, 1, d.R, generator=g).to(dtype)
    xs = [(torch.randn(s, d.hidden, generator=g, dtype=torch.float64)).to(dtype) for s in seq_lens]
    for r in range(B):
        fill_context(d, ws, xs[r][: seq_lens[r] - q_lens[r]], nope, rope, blocks[r], bs)
    hidden = torch.cat([xs[r][seq_lens[r] - q_lens[r]:] for r in range(B)])
    qsl = torch.tensor([0] + list(torch.tensor(q_lens).cumsum(0)), dtype=torch.int32)
    cos, sin = rope_tables(max(seq_lens) + 4, d.R)
    builder = mla.MetadataBuilder(max_num_reqs=8, max_num_tokens=256, max_blocks_per_req=mbr, block_size=bs,
                                  num_blocks=nb, cos_table=cos.to(dtype), sin_table=sin.to(dtype),
                                  num_speculative_tokens=spec, workspace_tokens=workspace)
    md = builder.build(qsl, torch.tensor(seq_lens, dtype=torch.int32), table)
    scale = 1.0 / math.sqrt(d.P + d.R)
    impl = mla.Impl(num_heads=d.H, hidden_size=d.hidden, q_lora_rank=d.Q, kv_lora_rank=d.L,
                    qk_nope_head_dim=d.P, qk_rope_head_dim=d.R, v_head_dim=d.V, scale=scale,
                    enable_prolog=prolog, enable_kv_nz=nz, **impl_kw, **ws)
    ref = torch.cat([attend_request(d, ws, xs[r], q_lens[r], scale) for r in range(B)])
    return SimpleNamespace(d=d, ws=ws, builder=builder, md=md, impl=impl, hidden=hidden, nope=nope, rope=rope,
                           ref=ref, xs=xs, blocks=blocks, bs=bs, table=table)


def run_case(seq_lens, q_lens, *, dims=None, dtype=torch.float32, bs=16, spec=0, prolog=False, workspace=0,
             seed=0, nz=False, tol=None, **impl_kw):
    c = setup_case(seq_lens, q_lens, dims=dims, dtype=dtype, bs=bs, spec=spec, prolog=prolog, workspace=workspace,
                   seed=seed, nz=nz, **impl_kw)
    impl, md, hidden, nope, rope = c.impl, c.md, c.hidden, c.nope, c.rope
    out = torch.full_like(hidden, 7.0)
    if nz:
        nope_nz, rope_nz = mla.Backend.to_nz(nope), mla.Backend.to_nz(rope)
        impl.forward(hidden, nope_nz, rope_nz, md, out)
        nope, rope = mla.Backend.from_nz(nope_nz), mla.Backend.from_nz(rope_nz)
    else:
        impl.forward(hidden, nope, rope, md, out)
    torch.testing.assert_close(out.to(torch.float64), c.ref, **(tol or _tol(dtype)))
    run_case.last_out = out
    return md, impl, (nope, rope), c.ws, c.d, (c.xs, c.blocks, bs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("qlora", [True, False])
def test_decode_only(dtype, qlora):
    d = MlaDims(Q=48 if qlora else None)
    md, impl, *_ = run_case([5, 17, 33], [1, 1, 1], dims=d, dtype=dtype)
    assert md.num_decodes == 3 and md.num_prefills == 0
    assert impl.last_decode_path == "native"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_prefill_without_context(dtype):
    md, *_ = run_case([6, 9], [6, 9], dtype=dtype)
    assert md.num_prefills == 2 and md.num_context_chunks == 0


@pytest.mark.parametrize("qlora", [True, False])
def test_prefill_with_context_several_chunks(qlora):
    # workspace 32 tokens, block 16, 2 prefills with context -> chunk 16 tokens: 3 chunks.
    md, *_ = run_case([45, 30], [5, 4], dims=MlaDims(Q=48 if qlora else None), workspace=32)
    assert md.num_context_chunks == 3
    # contexts [40, 26]: chunk lens [[16, 16], [16, 10], [8, 0]]
    assert md.context_seq_tot == [32, 26, 8]
    assert md.context_kv_ends == [[16, 32], [16, 26], [8, 8]]
    assert md.context_starts.tolist() == [[0, 0], [16, 16], [32, 32]]
    assert md.context_cu_seq_lens.tolist() == [[0, 16, 32], [0, 16, 26], [0, 8, 8]]


def test_context_chunk_count_bounded():
    # workspace 16 tokens -> 16-token chunks would need 5 chunks of 70 tokens; fine (<= 15).
    md, *_ = run_case([75], [3], workspace=16)
    assert md.num_context_chunks == 5


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_mixed_batch(dtype):
    md, *_ = run_case([12, 20, 40, 9], [1, 1, 7, 9], dtype=dtype, workspace=32)
    assert (md.num_decodes, md.num_prefills, md.num_decode_tokens) == (2, 2, 2)


@pytest.mark.parametrize("heads", [4, 5])
def test_prefill_in_bf16_for_other_dtypes(heads):
    # docs/design/mla.md §5.5 (what the NPU's TND kernel needs): fp32 activations attend in bf16 and come back
    # fp32, within bf16 tolerance of the reference, with context chunks and a decode in the batch.
    bf16_tol = dict(atol=2e-2, rtol=2e-2)
    run_case([12, 40, 9], [1, 7, 9], dims=MlaDims(H=heads), workspace=16, prefill_in_bf16=True, tol=bf16_tol)
    cast = run_case.last_out
    run_case([12, 40, 9], [1, 7, 9], dims=MlaDims(H=heads), workspace=16, prefill_in_bf16=False)
    plain = run_case.last_out
    assert cast.dtype == torch.float32
    torch.testing.assert_close(cast[:1], plain[:1])  # the decode row is not affected
    assert (cast[1:] - plain[1:]).abs().max() > 1e-6  # the prefill rows went through bf16


def test_prefill_in_bf16_for_an_fp16_model():
    # docs/design/mla.md §5.5: upstream mixes bf16 queries with fp16 kv_b_proj outputs in the context path; here every
    # attention input is cast, and the result comes back fp16.
    run_case([12, 40, 9], [1, 7, 9], dtype=torch.float16, workspace=16, prefill_in_bf16=True,
             tol=dict(atol=2e-2, rtol=2e-2))
    assert run_case.last_out.dtype == torch.float16


def test_twenty_heads_are_padded():
    md, impl, *_ = run_case([10, 26, 30], [1, 1, 5], dims=MlaDims(H=20), workspace=32)
    assert impl.num_heads_padded == 32


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_speculative_decode(dtype):
    # 1 speculative token: decodes carry 2 tokens (TND_NTD layout, causal within the request).
    md, *_ = run_case([12, 20, 30], [2, 2, 6], spec=1, dtype=dtype, workspace=64)
    assert md.num_decodes == 2 and md.num_decode_tokens == 4
    assert md.decode_actual_seq_lengths_q == [2, 4]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_prolog_path_equals_reference(dtype):
    md, impl, *_ = run_case([7, 19], [1, 1], prolog=True, dtype=dtype)
    assert impl.last_decode_path == "prolog"


def test_prolog_and_native_write_the_same_cache():
    a = run_case([7, 19], [1, 1], prolog=True, seed=3)
    b = run_case([7, 19], [1, 1], prolog=False, seed=3)
    torch.testing.assert_close(a[2][0], b[2][0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(a[2][1], b[2][1], atol=1e-5, rtol=1e-5)


def test_nz_caches_decode():
    run_case([7, 19], [1, 1], nz=True)


def test_decode_writes_cache_rows_and_skips_padding():
    md, impl, caches, ws, d, (xs, blocks, bs) = run_case([5, 17], [1, 1])
    # The new token's latent row equals the reference RMSNorm(c) * gamma.
    from _mla_reference import project
    _, _, c, _ = project(d, ws, xs[1], torch.arange(17))
    blk, off = blocks[1][16 // bs], 16 % bs
    torch.testing.assert_close(caches[0][blk, off, 0].double(), c[16], atol=1e-5, rtol=1e-5)


_ATTENTION_UPDATE = {
    # The CPU twin called by name, and the runtime's wrapper (ops::attention_update, what the MLA prefill's
    # context-chunk merge calls; the provider follows the tensors' device: the CPU twin here).
    "twin": lambda lses, outs, t: torch.ops.ascend_cpu.npu_attention_update(lses, outs, t),
    "wrapper": lambda lses, outs, t: aar._C._testing.attention_update(lses, outs, t, "auto"),
}


@pytest.mark.parametrize("via", list(_ATTENTION_UPDATE))
def test_lse_merge_with_empty_partitions(via):
    # npu_attention_update: a partition whose LSE is -inf everywhere contributes nothing, a row empty in
    # every partition gives 0 and LSE -inf, and the rest is the float64 LSE-weighted merge.
    merge = _ATTENTION_UPDATE[via]
    g = torch.Generator().manual_seed(5)
    M, D = 12, 16
    lses = [torch.randn(M, generator=g) for _ in range(4)]
    lses[1][:] = float("-inf")            # an empty partition
    for l in lses:
        l[3] = float("-inf")              # a row empty everywhere
    outs = [torch.randn(M, D, generator=g) for _ in range(4)]
    outs[1].fill_(1e30)                   # what an empty partition holds must not leak into the merge
    out, lse = merge(lses, outs, 1)
    ref, ref_lse = lse_merge(lses, outs)
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-5)
    assert torch.all(out[3] == 0) and lse[3].item() == float("-inf")
    finite = torch.isfinite(ref_lse)
    assert finite.sum() == M - 1
    torch.testing.assert_close(lse.double()[finite], ref_lse[finite])
    # Dropping the empty partition changes nothing.
    keep = [0, 2, 3]
    out3, lse3 = merge([lses[i] for i in keep], [outs[i] for i in keep], 1)
    torch.testing.assert_close(out3, out, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(lse3[finite], lse[finite])
    # update_type 0: the merged output only.
    out0, lse0 = merge(lses, outs, 0)
    torch.testing.assert_close(out0, out)
    assert lse0.numel() == 0


def test_weight_split_and_rope_permutation():
    H, P, V, L = 3, 4, 5, 6
    w = torch.randn(H * (P + V), L, dtype=torch.float64)
    uk, uv = mla.split_kv_b_proj(w, H, P, V)
    assert uk.shape == (H, P, L) and uv.shape == (H, L, V)
    for h in range(H):
        for p in range(P):
            assert torch.equal(uk[h, p], w[h * (P + V) + p])
        for v in range(V):
            assert torch.equal(uv[h, :, v], w[h * (P + V) + P + v])
    x = torch.arange(10.0).view(10, 1)
    assert mla.trans_rope_weight(x, 4).view(-1).tolist() == [0, 1, 2, 3, 4, 5, 6, 8, 7, 9]
    assert torch.equal(mla.trans_rope_weight(x, 0), x)


@pytest.mark.parametrize("shape", [(16, 32), (20, 40), (5, 3), (33, 64)])
def test_transdata_index_maths(shape):
    a = torch.randn(*shape, dtype=torch.float64)
    z = mla.transdata(a, 16, 32)
    r, c = -(-shape[0] // 16) * 16, -(-shape[1] // 32) * 32
    assert z.shape == (c // 32, r, 32)
    for j in range(c // 32):
        for i in range(r):
            for k in range(32):
                col = 32 * j + k
                want = a[i, col] if i < shape[0] and col < shape[1] else 0.0
                assert z[j, i, k] == want
    # The (16, 16) variant of docs/design/mla.md §4.3.
    z16 = mla.transdata(a, 16, 16)
    assert z16.shape == (-(-shape[1] // 16), r, 16)


def test_plan_vectors_through_python():
    assert mla.pad_actual_q_disable_mode([1, 2, 4, 5], 4, 8) == [1, 2, 4, 5, 6, 6, 7, 8]
    assert mla.pad_actual_q_enable_mode([2, 4, 6], 3, 1, [2, 4, 6, 8]) == [2, 4, 6, 8]
    assert mla.pad_actual_q_enable_mode([2, 4, 6], 3, 1, [2, 4, 6, 100]) == [2, 4, 6, 100]
    perm, swaps = mla.reorder_batch(torch.tensor([1, 3, 1, 2], dtype=torch.int32), 1)
    assert swaps == [(1, 2)]
    c = mla.plan_context_chunks(torch.tensor([1000, 0, 300], dtype=torch.int32), 1024, 128)
    assert c["cu_seq_lens"] == [[0, 512, 512, 812], [0, 488, 488, 488]]


def test_backend_facts():
    B = mla.Backend
    assert B.name() == "ASCEND_MLA"
    assert B.kv_cache_shapes(10, 128, 512, 64) == [[10, 128, 1, 512], [10, 128, 1, 64]]
    assert B.num_heads_padded(20) == 32 and B.num_heads_padded(128) == 128
    assert B.nz_cache_shape(10, 128, 512, 2) == [10, 1, 32, 128, 16]
    x = torch.randn(3, 16, 1, 32, dtype=torch.bfloat16)
    nz = B.to_nz(x)
    assert nz.shape == (3, 1, 2, 16, 16)
    assert torch.equal(nz[1, 0, 1, 5, 3], x[1, 5, 0, 16 + 3])
    assert torch.equal(B.from_nz(nz), x)


# ---------------------------------------------------------------- bad input

def _impl(**over):
    d = MlaDims()
    ws = make_weights(d, torch.float32, torch.Generator().manual_seed(0))
    ws.update(over.pop("weights", {}))
    kw = dict(num_heads=d.H, hidden_size=d.hidden, q_lora_rank=d.Q, kv_lora_rank=d.L, qk_nope_head_dim=d.P,
              qk_rope_head_dim=d.R, v_head_dim=d.V)
    kw.update(over)
    return mla.Impl(**kw, **ws)


def test_bad_weights_and_heads():
    with pytest.raises(ValueError, match="kv_b_proj must have shape"):
        _impl(weights={"kv_b_proj": torch.randn(4 * 60, 64)})
    with pytest.raises(ValueError, match="q_proj must have shape"):
        _impl(weights={"q_proj": torch.randn(10, 48)})
    with pytest.raises(ValueError, match="num_heads=256 is not supported"):
        _impl(num_heads=256)
    with pytest.raises(ValueError, match="enable_prolog needs q-LoRA"):
        d = MlaDims(Q=None)
        ws = make_weights(d, torch.float32, torch.Generator().manual_seed(0))
        mla.Impl(num_heads=d.H, hidden_size=d.hidden, kv_lora_rank=d.L, qk_nope_head_dim=d.P,
                 qk_rope_head_dim=d.R, v_head_dim=d.V, enable_prolog=True, **ws)


def test_bad_cache_widths_leave_cache_untouched():
    d = MlaDims()
    impl = _impl()
    cos, sin = rope_tables(64, d.R)
    b = mla.MetadataBuilder(max_num_reqs=4, max_num_tokens=64, max_blocks_per_req=4, block_size=16, num_blocks=8,
                            cos_table=cos.float(), sin_table=sin.float())
    md = b.build(torch.tensor([0, 1], dtype=torch.int32), torch.tensor([5], dtype=torch.int32),
                 torch.tensor([[2, 0, 0, 0]], dtype=torch.int32))
    h = torch.randn(1, d.hidden)
    good_nope, good_rope = torch.zeros(8, 16, 1, d.L), torch.zeros(8, 16, 1, d.R)
    with pytest.raises(ValueError, match="nope_cache must have shape"):
        impl.forward(h, torch.zeros(8, 16, 1, d.L + 1), good_rope, md, torch.empty_like(h))
    with pytest.raises(ValueError, match="rope_cache must have shape"):
        impl.forward(h, good_nope, torch.zeros(8, 16, 1, 2 * d.R), md, torch.empty_like(h))
    assert torch.all(good_nope == 0) and torch.all(good_rope == 0)
    with pytest.raises(ValueError, match="hidden_states must have shape"):
        impl.forward(torch.randn(1, 7), good_nope, good_rope, md, torch.empty(1, 7))
    with pytest.raises(ValueError, match="rope_cache is on meta but the layer's weights are on cpu"):
        impl.forward(h, good_nope, good_rope.to("meta"), md, torch.empty_like(h))
    assert torch.all(good_nope == 0)


def test_mixed_step_with_nz_caches_is_rejected_before_any_write():
    # The decode part would write the NZ caches before the prefill part fails: checked up front.
    d = MlaDims()
    g = torch.Generator().manual_seed(0)
    ws = make_weights(d, torch.bfloat16, g)
    impl = mla.Impl(num_heads=d.H, hidden_size=d.hidden, q_lora_rank=d.Q, kv_lora_rank=d.L, qk_nope_head_dim=d.P,
                    qk_rope_head_dim=d.R, v_head_dim=d.V, enable_kv_nz=True, **ws)
    cos, sin = rope_tables(64, d.R)
    b = mla.MetadataBuilder(max_num_reqs=4, max_num_tokens=64, max_blocks_per_req=4, block_size=16, num_blocks=8,
                            cos_table=cos.bfloat16(), sin_table=sin.bfloat16())
    md = b.build(torch.tensor([0, 1, 4], dtype=torch.int32), torch.tensor([5, 3], dtype=torch.int32),
                 torch.tensor([[2, 0, 0, 0], [3, 0, 0, 0]], dtype=torch.int32))
    nope = mla.Backend.to_nz(torch.zeros(8, 16, 1, d.L, dtype=torch.bfloat16))
    rope = mla.Backend.to_nz(torch.zeros(8, 16, 1, d.R, dtype=torch.bfloat16))
    h = torch.randn(4, d.hidden).bfloat16()
    with pytest.raises(ValueError, match="1 prefills and enable_kv_nz"):
        impl.forward(h, nope, rope, md, torch.empty_like(h))
    assert torch.count_nonzero(nope) == 0 and torch.count_nonzero(rope) == 0


def test_profiling_run_zero_fills():
    impl = _impl()
    out = torch.ones(3, 128)
    impl.forward(torch.randn(3, 128), torch.zeros(1, 16, 1, 64), torch.zeros(1, 16, 1, 16), None, out)
    assert torch.all(out == 0)


# ---------------------------------------------------------------- persistent buffers (graph capture)

_TENSORS = ("query_start_loc", "slot_mapping", "attn_mask", "decode_block_table", "decode_cos", "decode_sin",
            "prefill_block_table", "prefill_cos", "prefill_sin", "context_cu_seq_lens", "context_starts",
            "context_chunk_seq_lens")


def _stable_builder(separate=None, **kw):
    d = MlaDims()
    cos, sin = rope_tables(256, d.R)
    args = dict(max_num_reqs=8, max_num_tokens=128, max_blocks_per_req=16, block_size=16, num_blocks=64,
                cos_table=cos.float(), sin_table=sin.float(), workspace_tokens=32,
                separate_device_buffers=separate)
    args.update(kw)
    return mla.MetadataBuilder(**args), cos.float(), sin.float()


def _batch(q_lens, seq_lens, stride=16):
    qsl = torch.tensor([0] + list(torch.tensor(q_lens).cumsum(0)), dtype=torch.int32)
    table = (torch.arange(len(seq_lens) * stride, dtype=torch.int32).view(-1, stride) * 3) % 40
    return qsl, torch.tensor(seq_lens, dtype=torch.int32), table


@pytest.mark.parametrize("separate", [None, True])
def test_metadata_tensors_keep_their_addresses(separate):
    b, cos, sin = _stable_builder(separate)
    md = b.build(*_batch([1, 1, 5, 4], [12, 20, 45, 30]))  # 2 decodes, 2 prefills, 3 chunks
    assert md.num_context_chunks == 3
    ptrs = {n: getattr(md, n).data_ptr() for n in _TENSORS}
    md = b.build(*_batch([1, 1, 1, 3, 2, 7], [9, 40, 17, 33, 20, 7]))  # 3 decodes, 3 prefills, 2 chunks
    assert (md.num_decodes, md.num_prefills, md.num_context_chunks) == (3, 3, 2)
    for n in _TENSORS:
        assert getattr(md, n).data_ptr() == ptrs[n], n
    # The contents are this step's.
    assert md.query_start_loc.tolist() == [0, 1, 2, 3, 6, 8, 15]
    assert md.slot_mapping.dtype == torch.int64 and md.slot_mapping.shape == (15,)
    dpos = torch.tensor([8, 39, 16])
    ppos = torch.tensor([30, 31, 32, 18, 19, 0, 1, 2, 3, 4, 5, 6])
    assert torch.equal(md.decode_cos, cos[dpos]) and torch.equal(md.decode_sin, sin[dpos])
    assert torch.equal(md.prefill_cos, cos[ppos]) and torch.equal(md.prefill_sin, sin[ppos])
    table = _batch([1] * 6, [1] * 6)[2]
    assert torch.equal(md.decode_block_table, table[:3]) and torch.equal(md.prefill_block_table, table[3:])
    # Decode-only builds of different sizes reuse the same buffers too.
    for B in (1, 4, 8):
        md = b.build(*_batch([1] * B, [10 + r for r in range(B)]))
        for n in ("query_start_loc", "slot_mapping", "decode_block_table", "decode_cos", "decode_sin"):
            assert getattr(md, n).data_ptr() == ptrs[n], n


def test_steady_state_build_reuses_its_views():
    b, *_ = _stable_builder()
    args = _batch([1] * 4, [10, 11, 12, 13])
    md = b.build(*args)
    views = [getattr(md, n) for n in ("query_start_loc", "slot_mapping", "decode_block_table", "decode_cos")]
    md = b.build(*args)
    # Same TensorImpl (PyTorch hands back the same Python object): no tensor was created.
    assert all(v is getattr(md, n) for v, n in
               zip(views, ("query_start_loc", "slot_mapping", "decode_block_table", "decode_cos")))


@pytest.mark.parametrize("separate", [None, True])
@pytest.mark.parametrize("dtype,R", [(torch.bfloat16, 64), (torch.float32, 64), (torch.float16, 16),
                                     (torch.float32, 16), (torch.float64, 64), (torch.bfloat16, 6),
                                     (torch.float64, 6)])
def test_rope_rows_are_views_of_the_packed_buffer(separate, dtype, R):
    # The builder gathers the RoPE rows on the host into its packed int32 buffer
    # (one host-to-device copy per step); the metadata's cos/sin reinterpret those
    # words as the table dtype. Row sizes 32..512 bytes cover the specialised
    # gathers (64/128/256/512) and the generic one.
    cos, sin = (t.to(dtype) for t in rope_tables(300, R))
    b = mla.MetadataBuilder(max_num_reqs=8, max_num_tokens=64, max_blocks_per_req=8, block_size=64,
                            num_blocks=40, cos_table=cos, sin_table=sin, num_speculative_tokens=1,
                            separate_device_buffers=separate)
    q, seq = [1, 2, 1, 5, 3], [40, 2, 299, 120, 3]  # decode threshold 2: 3 decodes, 2 prefills
    qsl = torch.tensor([0] + list(torch.tensor(q).cumsum(0)), dtype=torch.int32)
    table = torch.arange(40, dtype=torch.int32).view(5, 8)
    md = b.build(qsl, torch.tensor(seq, dtype=torch.int32), table)
    assert (md.num_decodes, md.num_prefills) == (3, 2)
    dpos, ppos = torch.tensor([39, 0, 1, 298]), torch.tensor([115, 116, 117, 118, 119, 0, 1, 2])
    for name, want in (("decode_cos", cos[dpos]), ("decode_sin", sin[dpos]), ("prefill_cos", cos[ppos]),
                       ("prefill_sin", sin[ppos])):
        got = getattr(md, name)
        assert got.dtype == dtype and got.shape == (len(want), R) and got.is_contiguous(), name
        assert torch.equal(got, want), name
    # A later decode-only step rewrites the decode rows in place.
    md = b.build(torch.tensor([0, 1], dtype=torch.int32), torch.tensor([7], dtype=torch.int32), table[:1])
    assert torch.equal(md.decode_cos, cos[6:7]) and torch.equal(md.decode_sin, sin[6:7])


def test_rope_rows_must_pack_into_int32_words():
    t = torch.zeros(16, 6, dtype=torch.float8_e4m3fn)  # 1-byte floats: 6-byte rows
    with pytest.raises(ValueError, match=r"cos_table rows are 6 bytes .*needs a multiple of 4 bytes"):
        mla.MetadataBuilder(max_num_reqs=2, max_num_tokens=8, max_blocks_per_req=2, block_size=16, num_blocks=4,
                            cos_table=t, sin_table=t)


@pytest.mark.parametrize("separate", [None, True])
def test_rejected_build_leaves_previous_metadata_usable(separate):
    d = MlaDims()
    cos, sin = rope_tables(64, d.R)
    b, *_ = _stable_builder(separate, num_blocks=40, cos_table=cos.float(), sin_table=sin.float())
    seq, q = [12, 20, 45, 30], [1, 1, 5, 4]
    qsl, seq_t, table = _batch(q, seq)
    md = b.build(qsl, seq_t, table)
    snap = {n: getattr(md, n).clone() for n in _TENSORS}
    lists = (md.decode_seq_lens_list, md.decode_actual_seq_lengths_q, md.prefill_actual_seq_lengths_q,
             md.context_seq_tot, md.context_kv_ends, md.num_context_chunks, md.num_decodes, md.num_actual_tokens)
    impl = _impl()
    g = torch.Generator().manual_seed(1)
    hidden = torch.randn(sum(q), d.hidden, generator=g)
    nope, rope = torch.zeros(40, 16, 1, d.L), torch.zeros(40, 16, 1, d.R)
    out0 = torch.empty_like(hidden)
    impl.forward(hidden, nope, rope, md, out0)

    bad_table = table.clone()
    bad_table[1, 0] = 40
    with pytest.raises(ValueError, match=r"block_table\[1\]\[0\]=40 is out of range"):
        b.build(*_batch([1, 1], [3, 4])[:2], bad_table[:2])
    with pytest.raises(ValueError, match="exceeds the RoPE table length"):
        b.build(*_batch([1, 2], [3, 100]))
    with pytest.raises(ValueError, match="workspace_tokens=32 is too small"):
        b.build(*_batch([1, 3, 3, 3], [3, 20, 20, 20]))  # 3 prefills with context: 32 // 3 < one block
    with pytest.raises(ValueError, match="exceeds the builder's max_num_reqs"):
        b.build(*_batch([1] * 9, [3] * 9))
    with pytest.raises(ValueError, match="non-decreasing"):
        b.build(torch.tensor([0, 2, 1], dtype=torch.int32), torch.tensor([3, 3], dtype=torch.int32), table[:2])

    for n in _TENSORS:
        assert torch.equal(getattr(md, n), snap[n]), n
    assert (md.decode_seq_lens_list, md.decode_actual_seq_lengths_q, md.prefill_actual_seq_lengths_q,
            md.context_seq_tot, md.context_kv_ends, md.num_context_chunks, md.num_decodes,
            md.num_actual_tokens) == lists
    out1 = torch.empty_like(hidden)
    impl.forward(hidden, nope, rope, md, out1)
    torch.testing.assert_close(out1, out0, atol=0, rtol=0)


def test_rejected_build_without_chunked_prefill():
    b, *_ = _stable_builder(chunked_prefill_enabled=False)
    md = b.build(*_batch([1, 6], [9, 6]))
    snap = md.prefill_block_table.clone(), md.slot_mapping.clone()
    with pytest.raises(ValueError, match="chunked_prefill_enabled is false"):
        b.build(*_batch([1, 3], [9, 8]))
    assert torch.equal(md.prefill_block_table, snap[0]) and torch.equal(md.slot_mapping, snap[1])
    assert md.num_prefills == 1 and md.prefill_actual_seq_lengths_q == [6]


def test_draft_step_builds_the_lengths_base_plus_index_plus_one():
    # BuildInputs.draft_step (docs/design/cp.md §3.1, also without DCP): one token per request at position
    # base + d; the metadata equals a build with the lengths base + d + 1 given directly.
    cos, sin = rope_tables(64, 16)
    mk = dict(max_num_reqs=4, max_num_tokens=8, max_blocks_per_req=4, block_size=16, num_blocks=16,
              cos_table=cos, sin_table=sin)
    drafted, direct = aar.mla.MetadataBuilder(**mk), aar.mla.MetadataBuilder(**mk)
    qsl = torch.arange(4, dtype=torch.int32)
    base = torch.tensor([5, 17, 30], dtype=torch.int32)
    table = torch.arange(12, dtype=torch.int32).view(3, 4)
    for d in (0, 2):
        a = drafted.build(qsl, base, table, draft_step=d, is_prefilling=torch.tensor([True, True, True]))
        b = direct.build(qsl, base + d + 1, table)
        assert a.draft_step == d and b.draft_step == -1
        assert a.num_decodes == b.num_decodes == 3
        assert torch.equal(a.slot_mapping, b.slot_mapping)
        assert a.decode_seq_lens_list == b.decode_seq_lens_list == (base + d + 1).tolist()
        assert torch.equal(a.decode_cos, b.decode_cos) and torch.equal(a.decode_sin, b.decode_sin)
    with pytest.raises(ValueError, match=r"one query token per request: query_start_loc\[1\]=2"):
        drafted.build(torch.tensor([0, 2, 3, 4], dtype=torch.int32), base, table, draft_step=0)
    with pytest.raises(ValueError, match="draft_step=-3 is out of range"):
        drafted.build(qsl, base, table, draft_step=-3)


# ---------------------------------------------------------------- the step core and the backend contract

def test_counts_mean_what_they_mean_in_every_backend():
    # core::StepCounts: num_reqs the scheduled requests, num_kernel_reqs those plus graph decode
    # padding's dummy requests, max_query_len / max_seq_len over the scheduled requests.
    b, _, _ = _stable_builder(graph_decode_padding=True)
    md = b.build(*_batch([1, 1, 1], [12, 20, 45]), num_input_tokens=5)
    assert (md.num_reqs, md.num_kernel_reqs, md.decode_num_kernel_reqs) == (3, 5, 5)
    assert (md.num_actual_tokens, md.num_input_tokens, md.num_decodes, md.num_decode_tokens) == (3, 5, 3, 3)
    assert (md.max_query_len, md.max_seq_len) == (1, 45)
    md = b.build(*_batch([1, 5, 4], [12, 45, 30]))  # steps with prefills are not padded
    assert (md.num_reqs, md.num_kernel_reqs) == (3, 3)
    assert (md.num_prefills, md.num_prefill_tokens, md.max_query_len, md.max_seq_len) == (2, 9, 5, 45)


def test_graph_capture_and_drafting_builds_follow_the_contract():
    facts = aar.backend_facts("mla")
    assert facts["name"] == "ASCEND_MLA" and facts["kv_caches"] == ["nope_cache", "rope_cache"]
    assert facts["capturable"] == ["DecodeOnly", "SpecDecoding"] and not facts["draft_lanes"]
    assert facts["block_sizes"] == mla.Backend.supported_block_sizes()
    assert "mla_latent" not in [f["id"] for f in aar.backends()]  # LatentAttention takes the MLA metadata
    b, _, _ = _stable_builder()
    batch = _batch([1, 1], [12, 20])
    md = b.build_for_graph_capture(*batch, state=aar.AttentionState.SpecDecoding)
    assert md.attn_state == aar.AttentionState.SpecDecoding and md.num_decodes == 2
    gen = b.generation
    for state in (aar.AttentionState.ChunkedPrefill, aar.AttentionState.PrefillNoCache):
        refusal = f"{state.name} cannot be captured by the mla backend \\(only DecodeOnly, SpecDecoding\\)"
        with pytest.raises(NotImplementedError, match=refusal):
            b.build_for_graph_capture(*batch, state=state)
    assert b.generation == gen and md.is_current  # refused before anything was built
    d = b.build_for_drafting(*batch, 1)
    assert d.is_current and not md.is_current and d.attn_state == aar.AttentionState.DecodeOnly
    assert d.decode_seq_lens_list == [12, 20] and d.draft_step == -1
    with pytest.raises(ValueError, match="draft_index must be >= 0, got -1"):
        b.build_for_drafting(*batch, -1)
    assert d.is_current
