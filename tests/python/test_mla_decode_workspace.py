"""The MLA decode runs its intermediates in a workspace shared by the layers of one shape, with views cached
per batch size: these tests run several layers and batch sizes through one workspace (growing it, shrinking
back, padded and unpadded heads, native and fused-prolog preprocess) and check every output against the
float64 reference, plus padded input rows. Layers of one shape, dtype, device and workspace group share one
workspace (Impl.decode_workspace_id); another group gets its own."""

import math

import pytest
import torch

import ascend_attn_rt as aar
from _mla_reference import MlaDims, attend_request, fill_context, make_weights, rope_tables

mla = aar.mla
BS = 16


class Layer:
    """One MLA layer: weights, its own caches, the tokens written so far per request."""

    def __init__(self, d, dtype, seed, prolog, nb, group=0):
        g = torch.Generator().manual_seed(seed)
        self.d, self.dtype = d, dtype
        self.ws = make_weights(d, dtype, g)
        self.scale = 1.0 / math.sqrt(d.P + d.R)
        self.impl = mla.Impl(num_heads=d.H, hidden_size=d.hidden, q_lora_rank=d.Q, kv_lora_rank=d.L,
                             qk_nope_head_dim=d.P, qk_rope_head_dim=d.R, v_head_dim=d.V, scale=self.scale,
                             enable_prolog=prolog, layer_index=seed, workspace_group=group, **self.ws)
        self.nope = torch.randn(nb, BS, 1, d.L, generator=g).to(dtype)
        self.rope = torch.randn(nb, BS, 1, d.R, generator=g).to(dtype)


def _tol(dtype):
    return dict(atol=1e-4, rtol=1e-4) if dtype == torch.float32 else dict(atol=1e-2, rtol=1e-2)


def run_steps(d, dtype, prolog, steps, pad=0, graph_padding=False, bucket=None, groups=(0, 0), after_step=None):
    """steps: list of request-id lists; each step decodes one token of each listed request, whose context
    grows by one per step it is in. Two layers (workspace groups `groups`) run one after the other; every
    layer's output is compared with the reference after each step, then after_step(i, layers) runs.
    Returns the layers."""
    g = torch.Generator().manual_seed(99)
    num_reqs = 1 + max(max(s) for s in steps)
    ctx0 = [5 + 7 * r for r in range(num_reqs)]
    total = [c + sum(r in s for s in steps) for r, c in enumerate(ctx0)]
    mbr = max(math.ceil(t / BS) for t in total)
    nb = num_reqs * mbr + 2
    table = torch.arange(num_reqs * mbr, dtype=torch.int32).view(num_reqs, mbr)
    blocks = [table[r].tolist() for r in range(num_reqs)]
    layers = [Layer(d, dtype, seed, prolog, nb, group) for seed, group in zip((1, 2), groups)]
    # Every layer sees the same token stream (its hidden states); fill each layer's context.
    xs = [torch.randn(total[r], d.hidden, generator=g, dtype=torch.float64).to(dtype) for r in range(num_reqs)]
    for layer in layers:
        for r in range(num_reqs):
            fill_context(d, layer.ws, xs[r][: ctx0[r]], layer.nope, layer.rope, blocks[r], BS)
    cos, sin = rope_tables(mbr * BS, d.R)
    builder = mla.MetadataBuilder(max_num_reqs=8, max_num_tokens=64, max_blocks_per_req=mbr, block_size=BS,
                                  num_blocks=nb, cos_table=cos.to(dtype), sin_table=sin.to(dtype),
                                  graph_decode_padding=graph_padding)
    seen = list(ctx0)
    for i, step in enumerate(steps):
        B = len(step)
        seq = torch.tensor([seen[r] + 1 for r in step], dtype=torch.int32)
        qsl = torch.arange(B + 1, dtype=torch.int32)
        if bucket is not None:
            pad = bucket - B  # a fixed token count, as in a graph bucket
        md = builder.build(qsl, seq, table[step].contiguous(), num_input_tokens=B + pad)
        assert md.decode_num_kernel_tokens == B + (pad if graph_padding else 0)
        hidden = torch.cat([xs[r][seen[r]: seen[r] + 1] for r in step]
                           + [torch.randn(pad, d.hidden, generator=g).to(dtype)])
        for layer in layers:
            out = torch.full_like(hidden, 7.0)
            layer.impl.forward(hidden, layer.nope, layer.rope, md, out)
            assert layer.impl.last_decode_path == ("prolog" if prolog else "native")
            ref = torch.cat([attend_request(d, layer.ws, xs[r][: seen[r] + 1], 1, layer.scale) for r in step])
            torch.testing.assert_close(out[:B].to(torch.float64), ref, **_tol(dtype))
            assert torch.count_nonzero(out[B:]) == 0  # padded rows: o_proj(0)
        for r in step:
            seen[r] += 1
        if after_step is not None:
            after_step(i, layers)
    return layers


# Grows the workspace (1 -> 2 -> 4 tokens), shrinks back, and repeats a size whose views are cached.
STEPS = [[0], [0, 1], [2, 0, 3, 1], [1], [3, 2], [0, 1]]


@pytest.mark.parametrize("heads", [4, 5])  # 5 heads run padded to 8
@pytest.mark.parametrize("prolog", [False, True])
def test_layers_share_the_decode_workspace(heads, prolog):
    d = MlaDims(H=heads)
    layers = run_steps(d, torch.float32, prolog, STEPS)
    # Both layers decoded through one workspace (same shape, dtype, device, group 0) ...
    shared = layers[0].impl.decode_workspace_id
    assert shared != 0 and layers[1].impl.decode_workspace_id == shared
    # ... which a third layer of that shape joins; another group, dtype or head count gets its own.
    others = {"same": Layer(d, torch.float32, 3, prolog, 4),
              "group 1": Layer(d, torch.float32, 3, prolog, 4, group=1),
              "bf16": Layer(d, torch.bfloat16, 3, prolog, 4),
              "heads": Layer(MlaDims(H=heads + 4), torch.float32, 3, prolog, 4)}
    ids = {k: v.impl.decode_workspace_id for k, v in others.items()}
    assert ids["same"] == shared
    assert len({shared, ids["group 1"], ids["bf16"], ids["heads"]}) == 4, ids


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("prolog", [False, True])
def test_padded_input_rows_get_zero_output(dtype, prolog):
    run_steps(MlaDims(H=5), dtype, prolog, [[0, 1], [1], [0, 1]], pad=3)


@pytest.mark.parametrize("prolog", [False, True])
def test_eager_decode_over_a_graph_padded_batch(prolog):
    # With graph decode padding the decode runs over the dummies too (KV length 0): their rows are 0.
    run_steps(MlaDims(H=5), torch.float32, prolog, [[0, 1], [1], [0, 1, 2]], pad=2, graph_padding=True)


@pytest.mark.parametrize("graph_padding", [False, True])
def test_fixed_input_token_count_with_varying_decodes(graph_padding):
    # The same num_input_tokens (the builder hands out the same slot-mapping view) with 2, 1, 3, 1 decodes.
    run_steps(MlaDims(H=5), torch.float32, False, [[0, 1], [1], [0, 1, 2], [2]], bucket=4,
              graph_padding=graph_padding)


def test_no_qlora_native():
    run_steps(MlaDims(Q=None), torch.bfloat16, False, STEPS[:3])


def _storage_uses(t):
    return torch._C._storage_Use_Count(t.untyped_storage()._cdata)


@pytest.mark.parametrize("groups", [(0, 7), (7, 7)])
@pytest.mark.parametrize("prolog", [False, True])
def test_workspace_groups_and_release_views(groups, prolog):
    # Two layers in the given workspace groups decode side by side, every output checked against the
    # reference; after the second step each layer drops the views a decode keeps (release_views: the
    # layer no longer holds views of its caches), and the following steps decode correctly again.
    uses = {}

    def after_step(i, layers):
        if i != 1:
            return
        for n, layer in enumerate(layers):
            kept = [_storage_uses(layer.nope), _storage_uses(layer.rope)]
            layer.impl.release_views()
            uses[n] = (kept, [_storage_uses(layer.nope), _storage_uses(layer.rope)])

    layers = run_steps(MlaDims(H=5), torch.float32, prolog, [[0, 1], [1], [0, 1, 2], [2]], groups=groups,
                       after_step=after_step)
    a, b = (layer.impl.decode_workspace_id for layer in layers)
    assert (a == b) == (groups[0] == groups[1])
    for n, (kept, released) in uses.items():
        assert all(r < k for k, r in zip(kept, released)), (n, kept, released)


def test_one_layer_alternating_decode_layouts():
    # The same layer decodes through a speculative builder (TND_NTD, 2 tokens per request) and a plain one
    # (BNSD_NBSD) in turn: its kept kernel arguments follow the layout.
    d, dtype = MlaDims(H=5), torch.float32
    g = torch.Generator().manual_seed(3)
    mbr, nb = 3, 8
    layer = Layer(d, dtype, 4, False, nb)
    table = torch.arange(2 * mbr, dtype=torch.int32).view(2, mbr)
    ctx0 = [6, 11]
    xs = [torch.randn(ctx0[r] + 12, d.hidden, generator=g, dtype=torch.float64).to(dtype) for r in range(2)]
    for r in range(2):
        fill_context(d, layer.ws, xs[r][: ctx0[r]], layer.nope, layer.rope, table[r].tolist(), BS)
    cos, sin = rope_tables(mbr * BS, d.R)
    builders = {spec: mla.MetadataBuilder(max_num_reqs=4, max_num_tokens=16, max_blocks_per_req=mbr, block_size=BS,
                                          num_blocks=nb, cos_table=cos, sin_table=sin, num_speculative_tokens=spec)
                for spec in (0, 1)}
    seen = list(ctx0)
    for spec in (1, 0, 1, 0):
        n = 1 + spec
        qsl = torch.arange(0, 2 * n + 1, n, dtype=torch.int32)
        seq = torch.tensor([seen[0] + n, seen[1] + n], dtype=torch.int32)
        md = builders[spec].build(qsl, seq, table)
        hidden = torch.cat([xs[r][seen[r]: seen[r] + n] for r in range(2)])
        out = torch.zeros_like(hidden)
        layer.impl.forward(hidden, layer.nope, layer.rope, md, out)
        ref = torch.cat([attend_request(d, layer.ws, xs[r][: seen[r] + n], n, layer.scale) for r in range(2)])
        torch.testing.assert_close(out.to(torch.float64), ref, atol=1e-4, rtol=1e-4)
        seen = [s + n for s in seen]
