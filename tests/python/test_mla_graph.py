"""MLA decode in graph mode: capture a decode bucket (projections, RoPE and cache
write as prepare calls, the absorbed latent attention as a fused call refreshed
per step, W_UV and o_proj as prepare calls), then update + replay; every replay
equals an eager forward of the same batch, caches included."""

import torch

import ascend_attn_rt as aar
from _mla_reference import MlaDims, make_weights, rope_tables

mla = aar.mla
BUCKET = 4


def _setup(spec=0, dtype=torch.float32, q_lora=True, padding=False, disable_pad=False):
    d = MlaDims(Q=48 if q_lora else None)
    g = torch.Generator().manual_seed(7)
    ws = make_weights(d, dtype, g)
    bs, mbr = 16, 4
    nb = BUCKET * mbr + 2
    cos, sin = rope_tables(mbr * bs + 4, d.R)
    builder = mla.MetadataBuilder(max_num_reqs=8, max_num_tokens=64, max_blocks_per_req=mbr, block_size=bs,
                                  num_blocks=nb, cos_table=cos.to(dtype), sin_table=sin.to(dtype),
                                  num_speculative_tokens=spec, graph_decode_padding=padding,
                                  disable_padded_drafter_batch=disable_pad)
    table = (torch.arange(BUCKET * mbr, dtype=torch.int32) + 1).view(BUCKET, mbr)
    kw = dict(num_heads=d.H, hidden_size=d.hidden, q_lora_rank=d.Q, kv_lora_rank=d.L, qk_nope_head_dim=d.P,
              qk_rope_head_dim=d.R, v_head_dim=d.V, scale=0.1, **ws)
    caches = [(torch.randn(nb, bs, 1, d.L, generator=g).to(dtype), torch.randn(nb, bs, 1, d.R, generator=g).to(dtype))
              for _ in range(2)]
    return d, g, builder, table, kw, caches



def _eager(kw, hidden, cache, md, fill=0.0, **impl_kw):
    """An eager forward of a fresh layer on copies of `cache`: (output, (nope, rope) after the write)."""
    nope, rope = cache[0].clone(), cache[1].clone()
    out = torch.full(hidden.shape, fill, dtype=hidden.dtype)
    mla.Impl(**impl_kw, **kw).forward(hidden, nope, rope, md, out)
    return out, (nope, rope)


def _capture_full_bucket(layer, builder, table, d, cache):
    """Captures one layer on a bucket of BUCKET one-token decodes: (graph, static hidden, static output, qsl)."""
    hidden_s, out = torch.zeros(BUCKET, d.hidden), torch.zeros(BUCKET, d.hidden)
    qsl = torch.arange(BUCKET + 1, dtype=torch.int32)
    md = builder.build(qsl, torch.full((BUCKET,), 16, dtype=torch.int32), table)
    graph = aar.GraphParams("recording")
    with graph.capture(BUCKET):
        layer.forward(hidden_s, *cache, md, out)
    return graph, hidden_s, out, qsl


import pytest


@pytest.mark.parametrize("spec", [0, 1])
def test_mla_decode_graph_replays_like_eager(spec):
    # spec 0: BNSD_NBSD decode, one token per request (4 requests);
    # spec 1: TND_NTD speculative decode, 2 tokens per request (2 requests).
    d, gen, builder, table, kw, caches = _setup(spec=spec)
    layers = [mla.Impl(layer_index=i, **kw) for i in range(2)]
    hidden_s = torch.zeros(BUCKET, d.hidden)
    outs = [torch.zeros(BUCKET, d.hidden) for _ in layers]
    per_req = 1 + spec
    nreq = BUCKET // per_req
    qsl = torch.arange(0, BUCKET + 1, per_req, dtype=torch.int32)
    table = table[:nreq].contiguous()
    md = builder.build(qsl, torch.full((nreq,), 16, dtype=torch.int32), table)
    assert md.num_decodes == nreq and md.num_decode_tokens == BUCKET
    graph = aar.GraphParams("recording")
    with graph.capture(BUCKET):
        for layer, (nope, rope), out in zip(layers, caches, outs):
            layer.forward(hidden_s, nope, rope, md, out)
    assert [c[0] for c in graph.calls(BUCKET)] == ["prepare", "fia_v2", "prepare"] * 2
    assert all(float(o.abs().sum()) == 0 for o in outs)  # capture records, it does not run

    for seq in ([5, 17, 33, 9], [40, 2, 11, 23], [64, 63, 2, 30]):
        seq = seq[:nreq]
        hidden = torch.randn(BUCKET, d.hidden, generator=gen)
        md = builder.build(qsl, torch.tensor(seq, dtype=torch.int32), table)
        expected, eager_caches = zip(*(_eager(kw, hidden, caches[i], md) for i in range(2)))
        hidden_s.copy_(hidden)
        graph.update(BUCKET, md)
        graph.replay(BUCKET)
        for i in range(2):
            torch.testing.assert_close(outs[i], expected[i], atol=1e-5, rtol=1e-5)
            assert torch.equal(caches[i][0], eager_caches[i][0]) and torch.equal(caches[i][1], eager_caches[i][1])


def test_mla_graph_rejects_a_batch_that_does_not_fit():
    d, gen, builder, table, kw, caches = _setup()
    layer = mla.Impl(**kw)  # kept alive: a bucket whose layer is gone refuses every update (graph.md §4.6)
    graph, *_ = _capture_full_bucket(layer, builder, table, d, caches[0])
    md3 = builder.build(torch.arange(4, dtype=torch.int32), torch.full((3,), 9, dtype=torch.int32), table[:3].contiguous())
    with pytest.raises(ValueError, match="one-token requests"):
        graph.update(BUCKET, md3)
    with pytest.raises(ValueError, match="before update"):
        graph.replay(BUCKET)


def test_mla_graph_refuses_a_step_of_another_builder():
    # docs/design/graph.md §1.2: the recorded prepare calls read the capturing builder's buffers.
    d, gen, builder, table, kw, caches = _setup()
    layer = mla.Impl(**kw)
    graph, *_ = _capture_full_bucket(layer, builder, table, d, caches[0])
    other, *_ = _setup()[2:3]
    foreign = other.build(torch.arange(BUCKET + 1, dtype=torch.int32), torch.full((BUCKET,), 9, dtype=torch.int32),
                          table)
    with pytest.raises(ValueError, match="another metadata builder"):
        graph.update(BUCKET, foreign)
    with pytest.raises(ValueError, match="before update"):
        graph.replay(BUCKET)
    graph.update(BUCKET, builder.build(torch.arange(BUCKET + 1, dtype=torch.int32),
                                       torch.full((BUCKET,), 9, dtype=torch.int32), table))
    graph.replay(BUCKET)


@pytest.mark.parametrize("spec", [0, 1])
@pytest.mark.parametrize("prolog", [False, True])
def test_mla_padded_decode_bucket_replays_like_eager(spec, prolog):
    # A bucket of 4 kernel tokens replays smaller decode batches padded with dummy requests
    # (graph_decode_padding: KV length 0, slot -1): the real rows equal an eager forward of the
    # unpadded batch, the padded rows are 0, and the caches match.
    d, gen, builder, table, kw, caches = _setup(spec=spec, padding=True)
    eager_builder = mla.MetadataBuilder(max_num_reqs=8, max_num_tokens=64, max_blocks_per_req=4, block_size=16,
                                        num_blocks=BUCKET * 4 + 2, cos_table=builder_cos(d), sin_table=builder_sin(d),
                                        num_speculative_tokens=spec)
    layers = [mla.Impl(layer_index=i, enable_prolog=prolog, **kw) for i in range(2)]
    per_req = 1 + spec
    hidden_s = torch.zeros(BUCKET, d.hidden)
    outs = [torch.zeros(BUCKET, d.hidden) for _ in layers]
    # Capture with a padded batch too (one real request).
    md = builder.build(torch.tensor([0, per_req], dtype=torch.int32), torch.tensor([9], dtype=torch.int32),
                       table[:1].contiguous(), num_input_tokens=BUCKET)
    assert (md.num_decodes, md.decode_num_kernel_reqs, md.decode_num_kernel_tokens) == (1, BUCKET // per_req, BUCKET)
    graph = aar.GraphParams("recording")
    with graph.capture(BUCKET):
        for layer, (nope, rope), out in zip(layers, caches, outs):
            layer.forward(hidden_s, nope, rope, md, out)
    for seq in ([5, 17, 33, 9], [40, 2], [64], [11, 23, 30]):
        nreq = min(len(seq), BUCKET // per_req)
        seq = seq[:nreq]
        ntok = nreq * per_req
        qsl = torch.arange(0, ntok + 1, per_req, dtype=torch.int32)
        hidden = torch.randn(BUCKET, d.hidden, generator=gen)
        hidden[ntok:] = 0
        md_e = eager_builder.build(qsl, torch.tensor(seq, dtype=torch.int32), table[:nreq].contiguous(),
                                   num_input_tokens=BUCKET)
        expected, eager_caches = zip(*(_eager(kw, hidden, caches[i], md_e, fill=7.0, enable_prolog=prolog)
                                       for i in range(2)))
        md = builder.build(qsl, torch.tensor(seq, dtype=torch.int32), table[:nreq].contiguous(),
                           num_input_tokens=BUCKET)
        assert md.decode_seq_lens_list == seq + [0] * (BUCKET // per_req - nreq)
        hidden_s.copy_(hidden)
        graph.update(BUCKET, md)
        graph.replay(BUCKET)
        for i in range(2):
            torch.testing.assert_close(outs[i], expected[i], atol=1e-5, rtol=1e-5)
            assert torch.count_nonzero(outs[i][ntok:]) == 0
            # Same values; not bitwise: the projections run over 4 rows here and ntok rows eagerly.
            torch.testing.assert_close(caches[i][0], eager_caches[i][0], atol=1e-6, rtol=1e-6)
            torch.testing.assert_close(caches[i][1], eager_caches[i][1], atol=1e-6, rtol=1e-6)


def builder_cos(d):
    return rope_tables(4 * 16 + 4, d.R)[0]


def builder_sin(d):
    return rope_tables(4 * 16 + 4, d.R)[1]


def test_mla_graph_padding_rejects_a_bucket_that_is_not_a_multiple_of_the_decode_length():
    d, gen, builder, table, kw, caches = _setup(spec=1, padding=True)
    with pytest.raises(ValueError, match="not a multiple of the decode length 2"):
        builder.build(torch.tensor([0, 2], dtype=torch.int32), torch.tensor([9], dtype=torch.int32),
                      table[:1].contiguous(), num_input_tokens=5)


@pytest.mark.parametrize("prolog", [False, True])
def test_mla_weight_reload_keeps_the_captured_graph_valid(prolog):
    # docs/design/mla.md §4.6: weights reloaded in place (derived W_UK_T / W_UV / prolog weights recomputed at their
    # addresses): the captured graph replays with the new weights.
    d, gen, builder, table, kw, caches = _setup()
    kw = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
    layer = mla.Impl(enable_prolog=prolog, **kw)
    w_uk_addr = layer.w_uk_t.data_ptr()
    graph, hidden_s, out, qsl = _capture_full_bucket(layer, builder, table, d, caches[0])
    new = make_weights(d, torch.float32, torch.Generator().manual_seed(8))
    layer.reload_weights(**new)
    assert layer.w_uk_t.data_ptr() == w_uk_addr
    new_kw = dict(kw, **new)
    seq = torch.tensor([5, 17, 33, 9], dtype=torch.int32)
    hidden = torch.randn(BUCKET, d.hidden, generator=gen)
    md = builder.build(qsl, seq, table)
    expected, (nope, rope) = _eager(new_kw, hidden, caches[0], md, enable_prolog=prolog)
    hidden_s.copy_(hidden)
    graph.update(BUCKET, md)
    graph.replay(BUCKET)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(caches[0][0], nope, atol=1e-6, rtol=1e-6)

    # An in-place update by the caller, then refresh_weights(): eager now uses the newer weights.
    newer = make_weights(d, torch.float32, torch.Generator().manual_seed(9))
    for k, v in newer.items():
        kw[k].copy_(v)  # the layer's weight tensors are the caller's (aliased); new values were copied in
    layer.refresh_weights()
    out2 = torch.zeros(BUCKET, d.hidden)
    layer.forward(hidden, caches[0][0].clone(), caches[0][1].clone(), md, out2)
    exp2, _ = _eager(dict(kw, **newer), hidden, caches[0], md, enable_prolog=prolog)
    torch.testing.assert_close(out2, exp2, atol=1e-5, rtol=1e-5)


def test_mla_reload_rejects_other_shapes():
    d, gen, builder, table, kw, caches = _setup()
    layer = mla.Impl(**kw)
    bad = dict(make_weights(d, torch.float32, torch.Generator().manual_seed(8)))
    bad["kv_b_proj"] = bad["kv_b_proj"][:, :-1]
    with pytest.raises(ValueError, match="kv_b_proj must have shape"):
        layer.reload_weights(**bad)


def test_mla_disable_pad_bucket_replays_like_eager():
    # docs/design/mla.md §3.5 "disable-pad" (full-graph MTP without a padded drafter batch): a 4-token bucket always has
    # 4 kernel rows; the query ends of the dummies are interpolated (a dummy may get 0 tokens).
    d, gen, builder, table, kw, caches = _setup(spec=1, padding=True, disable_pad=True)
    eager_builder = mla.MetadataBuilder(max_num_reqs=8, max_num_tokens=64, max_blocks_per_req=4, block_size=16,
                                        num_blocks=BUCKET * 4 + 2, cos_table=builder_cos(d), sin_table=builder_sin(d),
                                        num_speculative_tokens=1)
    layer = mla.Impl(**kw)
    hidden_s, out = torch.zeros(BUCKET, d.hidden), torch.zeros(BUCKET, d.hidden)
    md = builder.build(torch.tensor([0, 2], dtype=torch.int32), torch.tensor([9], dtype=torch.int32),
                       table[:1].contiguous(), num_input_tokens=BUCKET)
    assert md.decode_actual_seq_lengths_q == [2, 3, 3, 4] and md.decode_num_kernel_reqs == BUCKET
    graph = aar.GraphParams("recording")
    with graph.capture(BUCKET):
        layer.forward(hidden_s, *caches[0], md, out)
    for seq, q_lens, want_q in (([5, 17], [2, 2], [2, 4, 4, 4]), ([40], [2], [2, 3, 3, 4]), ([11, 3], [1, 2], [1, 3, 4, 4])):
        n = len(seq)
        qsl = torch.tensor([0] + list(torch.tensor(q_lens).cumsum(0)), dtype=torch.int32)
        ntok = int(qsl[-1])
        hidden = torch.randn(BUCKET, d.hidden, generator=gen)
        hidden[ntok:] = 0
        md_e = eager_builder.build(qsl, torch.tensor(seq, dtype=torch.int32), table[:n].contiguous(),
                                   num_input_tokens=BUCKET)
        expected, (nope, rope) = _eager(kw, hidden, caches[0], md_e, fill=7.0)
        md = builder.build(qsl, torch.tensor(seq, dtype=torch.int32), table[:n].contiguous(), num_input_tokens=BUCKET)
        assert md.decode_actual_seq_lengths_q == want_q
        hidden_s.copy_(hidden)
        graph.update(BUCKET, md)
        graph.replay(BUCKET)
        torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
        assert torch.count_nonzero(out[ntok:]) == 0
        torch.testing.assert_close(caches[0][0], nope, atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(caches[0][1], rope, atol=1e-6, rtol=1e-6)
