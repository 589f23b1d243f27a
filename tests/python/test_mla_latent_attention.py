"""mla.LatentAttention: the MLA attention without the projections (the entry vLLM's
MLAAttention layer needs), against the float64 un-absorbed reference of
_mla_reference.latent_attention_reference: the test absorbs W_UK into the decode query
and applies W_UV to the decode's latent output itself, as the engine would. Decode,
prefill, chunked prefill over several context chunks, mixed batches and speculative
decode; fp32 / fp16 / bf16; 8 heads and 20 heads (padded to 32 for the decode kernel,
concatenated q/k in the prefill); the cache write; bad input."""

import math
from types import SimpleNamespace

import pytest
import torch

from ascend_attn_rt import _C as aar
from _mla_reference import latent_attention_reference
from _reference import assert_close

mla = aar.mla
L, P, R, V = 64, 32, 16, 32
BS = 16


def _case(seq_lens, q_lens, *, H=8, dtype=torch.float32, spec=0, workspace=0, seed=0):
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g, dtype=torch.float64) * scale).to(dtype)

    B = len(seq_lens)
    per_req = [math.ceil(s / BS) for s in seq_lens]
    nb = sum(per_req) + 3
    perm = torch.randperm(nb, generator=g).tolist()
    width = max(per_req)
    table = torch.zeros(B, width, dtype=torch.int32)
    k = 0
    for r, n in enumerate(per_req):
        table[r, :n] = torch.tensor(perm[k:k + n], dtype=torch.int32)
        k += n
    kv_cache = rnd(nb, BS, L + R)  # garbage where unused: a read of a wrong slot shows
    nope, rope = mla.LatentAttention.split_kv_cache(kv_cache, L)
    c = [rnd(s, L) for s in seq_lens]
    kpe = [rnd(s, R) for s in seq_lens]
    q = [rnd(ql, H, P + R) for ql in q_lens]
    w = rnd(H * (P + V), L, scale=L ** -0.5)
    for r, (s, ql) in enumerate(zip(seq_lens, q_lens)):  # the context, by plain indexing
        for p in range(s - ql):
            blk, off = int(table[r, p // BS]), p % BS
            nope[blk, off, 0] = c[r][p]
            rope[blk, off, 0] = kpe[r][p]
    zeros = torch.zeros(max(seq_lens) + 4, R, dtype=dtype)
    builder = mla.MetadataBuilder(max_num_reqs=8, max_num_tokens=256, max_blocks_per_req=width, block_size=BS,
                                  num_blocks=nb, cos_table=zeros, sin_table=zeros, num_speculative_tokens=spec,
                                  workspace_tokens=workspace)
    qsl = torch.tensor([0] + list(torch.tensor(q_lens).cumsum(0)), dtype=torch.int32)
    md = builder.build(qsl, torch.tensor(seq_lens, dtype=torch.int32), table)
    scale = 1.0 / math.sqrt(P + R)
    attn = mla.LatentAttention(num_heads=H, kv_lora_rank=L, qk_nope_head_dim=P, qk_rope_head_dim=R, v_head_dim=V,
                               scale=scale)
    ref = torch.cat([latent_attention_reference(q[r], c[r], kpe[r], w, ql, scale, H, P, V)
                     for r, ql in enumerate(q_lens)])
    new = lambda xs: torch.cat([x[s - ql:] for x, s, ql in zip(xs, seq_lens, q_lens)])  # noqa: E731
    return SimpleNamespace(H=H, dtype=dtype, kv_cache=kv_cache, nope=nope, rope=rope, q=torch.cat(q), c=new(c),
                           kpe=new(kpe), w=w, md=md, builder=builder, attn=attn, ref=ref, table=table)


def _run(t):
    """The step as an engine runs it: cache write, absorbed decode + W_UV, prefill."""
    md, H = t.md, t.H
    n = md.num_actual_tokens
    t.attn.write_kv(t.c, t.kpe.unsqueeze(1), md.slot_mapping[:n], t.nope, t.rope)
    out = torch.full((n, H, V), 7.0, dtype=torch.float64)
    td = md.num_decode_tokens
    wv = t.w.to(torch.float64).view(H, P + V, L)
    if td:
        qn = t.q[:td, :, :P].to(torch.float64)
        ql_nope = torch.einsum("ihp,hpl->ihl", qn, wv[:, :P]).to(t.dtype).transpose(0, 1).contiguous().transpose(0, 1)
        lat = torch.full((td, H, L), 7.0, dtype=t.dtype)
        t.attn.forward_decode(ql_nope, t.q[:td, :, P:], t.nope, t.rope, md, lat)
        out[:td] = torch.einsum("ihl,hvl->ihv", lat.to(torch.float64), wv[:, P:])
    if md.num_prefills:
        o = torch.full((n - td, H * V), 7.0, dtype=t.dtype)
        t.attn.forward_prefill(t.q[td:], t.c[td:], t.kpe[td:].unsqueeze(1), t.w, t.nope, t.rope, md, o)
        out[td:] = o.view(-1, H, V).to(torch.float64)
    return out


CASES = [
    pytest.param([17, 40, 5], [1, 1, 1], 0, 0, id="decode"),
    pytest.param([9, 30], [9, 30], 0, 0, id="prefill"),
    pytest.param([40, 70], [8, 20], 0, 32, id="chunked_prefill_several_chunks"),
    pytest.param([33, 12, 50], [1, 1, 14], 0, 0, id="mixed"),
    pytest.param([20, 31, 9], [3, 2, 1], 2, 0, id="spec_decode"),
    pytest.param([20, 31, 40], [3, 1, 12], 2, 16, id="spec_decode_mixed"),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("H", [8, 20])
@pytest.mark.parametrize("seq_lens,q_lens,spec,workspace", CASES)
def test_against_reference(seq_lens, q_lens, spec, workspace, H, dtype):
    t = _case(seq_lens, q_lens, H=H, dtype=dtype, spec=spec, workspace=workspace)
    if workspace:
        assert t.md.num_context_chunks > 1  # the context really is read in several chunks
    if spec:
        assert t.md.num_decode_tokens == sum(q for q in q_lens if q <= 1 + spec)
    assert t.attn.num_heads_padded == (8 if H == 8 else 32)
    assert_close(_run(t), t.ref, dtype)
    # The step's rows went to their slots.
    n = t.md.num_actual_tokens
    slots = t.md.slot_mapping[:n].long()
    assert torch.equal(t.nope.view(-1, L)[slots], t.c) and torch.equal(t.rope.view(-1, R)[slots], t.kpe)


def test_split_kv_cache_aliases_the_buffer():
    kv = torch.arange(3 * BS * (L + R), dtype=torch.float32).view(3, BS, L + R)
    nope, rope = mla.LatentAttention.split_kv_cache(kv, L)
    assert nope.shape == (3, BS, 1, L) and rope.shape == (3, BS, 1, R)
    assert nope.data_ptr() == kv.data_ptr() and rope.data_ptr() == kv.data_ptr() + 3 * BS * L * 4
    nope[1, 2, 0, 3] = -1.0
    assert kv.view(-1)[(1 * BS + 2) * L + 3] == -1.0
    with pytest.raises(ValueError, match="kv_cache must be contiguous"):
        mla.LatentAttention.split_kv_cache(kv.transpose(0, 1), L)
    with pytest.raises(ValueError, match="kv_lora_rank=80"):
        mla.LatentAttention.split_kv_cache(kv, L + R)


def test_write_kv_skips_negative_slots_and_rejects_bad_ones_untouched():
    t = _case([5], [5])
    nope0, rope0 = t.nope.clone(), t.rope.clone()
    slots = torch.tensor([3, -1, 7], dtype=torch.int64)
    t.attn.write_kv(t.c[:4], t.kpe[:4], slots, t.nope, t.rope)  # (T, R) k_pe, fewer slots than rows
    assert torch.equal(t.nope.view(-1, L)[3], t.c[0]) and torch.equal(t.rope.view(-1, R)[7], t.kpe[2])
    for cache, old, want in [(t.nope, nope0, {3: 0, 7: 2}), (t.rope, rope0, {3: 0, 7: 2})]:
        flat, flat0 = cache.view(cache.shape[0] * BS, -1), old.view(old.shape[0] * BS, -1)
        changed = (flat != flat0).any(-1).nonzero().view(-1).tolist()
        assert changed == sorted(want)  # row 1 (slot -1) and row 3 (no slot) are not written
    snap = t.kv_cache.clone()
    nslots = t.kv_cache.shape[0] * BS
    for bad, match in [
        (dict(slots=torch.tensor([0, nslots], dtype=torch.int64)), "slot"),
        (dict(kv_c=t.c[:2, :L - 1]), "kv_c must have shape"),
        (dict(k_pe=t.kpe[:2, :R - 1]), "k_pe must have shape"),
        (dict(kv_c=t.c[:2].double()), "kv_c dtype"),
        (dict(slots=torch.zeros(3, dtype=torch.int64)), "slot_mapping has 3 entries"),
        (dict(slots=torch.zeros(2, dtype=torch.float32)), "slot_mapping must be a 1-D int64 or int32"),
    ]:
        a = dict(kv_c=t.c[:2], k_pe=t.kpe[:2], slots=torch.tensor([0, 1], dtype=torch.int64))
        a.update(bad)
        with pytest.raises(ValueError, match=match):
            t.attn.write_kv(a["kv_c"], a["k_pe"], a["slots"], t.nope, t.rope)
        assert torch.equal(t.kv_cache, snap), f"a rejected write ({match}) changed the cache"


def test_bad_decode_and_prefill_arguments_name_them():
    t = _case([33, 12, 50], [1, 1, 14])
    md, a, H = t.md, t.attn, t.H
    lat = torch.empty(2, H, L)
    qn, qr = torch.zeros(2, H, L), torch.zeros(2, H, R)
    with pytest.raises(ValueError, match="ql_nope must have shape"):
        a.forward_decode(torch.zeros(3, H, L), qr, t.nope, t.rope, md, lat)
    with pytest.raises(ValueError, match="out must be contiguous"):
        a.forward_decode(qn, qr, t.nope, t.rope, md, torch.empty(H, 2, L).transpose(0, 1))
    with pytest.raises(ValueError, match="q_pe dtype"):
        a.forward_decode(qn, qr.half(), t.nope, t.rope, md, lat)
    with pytest.raises(ValueError, match="rope_cache must have shape"):
        a.forward_decode(qn, qr, t.nope, t.nope, md, lat)
    o = torch.empty(14, H * V)
    args = [t.q[2:], t.c[2:], t.kpe[2:], t.w, t.nope, t.rope, md, o]
    bad_w = list(args)
    bad_w[3] = t.w[:, : L - 1]
    with pytest.raises(ValueError, match="kv_b_proj must have shape"):
        a.forward_prefill(*bad_w)
    bad_q = list(args)
    bad_q[0] = t.q[3:]
    with pytest.raises(ValueError, match="q must have shape"):
        a.forward_prefill(*bad_q)
    t.builder.build(torch.tensor([0, 1], dtype=torch.int32), torch.tensor([5], dtype=torch.int32), t.table[:1])
    with pytest.raises(Exception, match="stale|current|metadata"):
        a.forward_decode(qn, qr, t.nope, t.rope, md, lat)


def test_refusals_name_what_is_not_supported():
    with pytest.raises(ValueError, match="num_heads"):
        mla.LatentAttention(num_heads=0, kv_lora_rank=L, qk_nope_head_dim=P, qk_rope_head_dim=R, v_head_dim=V)
    t = _case([9, 30], [9, 30])
    with pytest.raises(ValueError, match="no decode tokens"):
        t.attn.forward_decode(torch.zeros(0, 8, L), torch.zeros(0, 8, R), t.nope, t.rope, t.md, torch.zeros(0, 8, L))
    # Metadata built for DCP needs the layer's dcp_comm (DCP itself: test_vllm_dcp.py); graph decode padding
    # is mla::Impl's.
    zeros = torch.zeros(64, R)
    nb = t.nope.shape[0]
    dcp = mla.MetadataBuilder(max_num_reqs=4, max_num_tokens=64, max_blocks_per_req=4, block_size=BS, num_blocks=nb,
                              cos_table=zeros, sin_table=zeros, dcp_world_size=2, dcp_rank=0)
    md = dcp.build(torch.tensor([0, 1], dtype=torch.int32), torch.tensor([20], dtype=torch.int32),
                   torch.tensor([[0, 1, 2, 3]], dtype=torch.int32))
    with pytest.raises(ValueError, match="metadata was built for DCP rank 0 of 2 but the layer has no dcp_comm"):
        t.attn.forward_decode(torch.zeros(1, 8, L), torch.zeros(1, 8, R), t.nope, t.rope, md, torch.zeros(1, 8, L))
    pad = mla.MetadataBuilder(max_num_reqs=4, max_num_tokens=64, max_blocks_per_req=4, block_size=BS, num_blocks=nb,
                              cos_table=zeros, sin_table=zeros, graph_decode_padding=True)
    md = pad.build(torch.tensor([0, 1], dtype=torch.int32), torch.tensor([20], dtype=torch.int32),
                   torch.tensor([[0, 1, 2, 3]], dtype=torch.int32), num_input_tokens=4)
    assert (md.decode_num_kernel_tokens, md.num_decode_tokens) == (4, 1)
    with pytest.raises(NotImplementedError, match="graph decode padding"):
        t.attn.forward_decode(torch.zeros(1, 8, L), torch.zeros(1, 8, R), t.nope, t.rope, md, torch.zeros(1, 8, L))


def test_profiling_run_without_metadata_zero_fills_the_output():
    # The backend contract: metadata None is a profiling run (the output zero-filled, nothing else).
    t = _case([33, 12, 50], [1, 1, 14])
    H = t.H
    snap = (t.nope.clone(), t.rope.clone())
    lat = torch.full((2, H, L), 7.0)
    t.attn.forward_decode(torch.zeros(2, H, L), torch.zeros(2, H, R), t.nope, t.rope, None, lat)
    assert torch.all(lat == 0)
    o = torch.full((14, H * V), 7.0)
    t.attn.forward_prefill(t.q[2:], t.c[2:], t.kpe[2:], t.w, t.nope, t.rope, None, o)
    assert torch.all(o == 0)
    assert torch.equal(t.nope, snap[0]) and torch.equal(t.rope, snap[1])
