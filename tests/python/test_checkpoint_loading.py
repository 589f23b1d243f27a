"""Weight loading from checkpoint names (aar.dsa.weights_from_checkpoint, aar.sfa.weights_from_checkpoint;
include/ascend_attn_rt/dsa/checkpoint.h, sfa/checkpoint.h).

Each layer is a transformers layer built from a small config (no download) with random weights: DeepseekV4Attention
for DSA (sliding-window, C4 with its indexer, C128), DeepseekV32Attention for SFA. Its state_dict goes through the
loader into the runtime's Impl, which runs a batch of requests (a prefill, then two decode steps) on the paged
caches; every output row must match the transformers layer's own forward over the same tokens (fp32). Where the
C4 indexer's top-k can differ from transformers' (the runtime's indexer keys are int8 on the a2 plan), the selection
is checked against transformers' own scores up to the quantisation margin and the transformers layer is run on the
runtime's selection. DeepSeek's published V4 names must load the same weights as transformers' names. A missing,
an unexpected and a misshapen key each raise ValueError naming the key; a quantisation scale NotImplementedError."""

from __future__ import annotations

import math

import pytest
import torch

import ascend_attn_rt as aar
import _dsa_reference as ref
from _dsa_harness import LayerRun

pytest.importorskip("transformers.models.deepseek_v4", reason="needs a transformers with DeepSeek-V4")
pytest.importorskip("transformers.models.deepseek_v32", reason="needs a transformers with DeepSeek-V3.2")
from transformers import DeepseekV32Config, DeepseekV4Config  # noqa: E402
from transformers.models.deepseek_v32.modeling_deepseek_v32 import (  # noqa: E402
    DeepseekV32Attention, DeepseekV32RotaryEmbedding)
from transformers.models.deepseek_v4.modeling_deepseek_v4 import (  # noqa: E402
    DeepseekV4Attention, DeepseekV4RotaryEmbedding)

F64 = torch.float64
LAYER_OF_RATIO = {1: 0, 4: 1, 128: 2}  # the config's layer_types below


def _init_random(module: torch.nn.Module, seed: int):
    """Deterministic weights that keep activations O(1) (transformers leaves sinks / position_bias uninitialised)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(module.named_parameters()):
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=g))
            elif name.endswith("norm.bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            elif name.endswith("sinks"):
                p.copy_(torch.randn(p.shape, generator=g))
            elif name.endswith("position_bias"):
                p.copy_(0.5 * torch.randn(p.shape, generator=g))
            else:
                assert p.dim() == 2, name
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p.shape[1]))


# ----------------------------------------------------------------------------------------------------------------
# DeepSeek-V4 (DSA)


def v4_config(index_topk: int) -> DeepseekV4Config:
    cfg = DeepseekV4Config(hidden_size=64, num_attention_heads=4, head_dim=64, partial_rotary_factor=16 / 64,
                           q_lora_rank=32, sliding_window=8, o_groups=2, o_lora_rank=16, index_n_heads=4,
                           index_head_dim=32, index_topk=index_topk, num_hidden_layers=3,
                           layer_types=["sliding_attention", "compressed_sparse_attention",
                                        "heavily_compressed_attention"],
                           vocab_size=128, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)
    cfg._attn_implementation = "eager"
    return cfg


def v4_dims(cfg: DeepseekV4Config, ratio: int) -> dict:
    """The loader's (and Impl's) dims of one layer of cfg."""
    return dict(hidden_size=cfg.hidden_size, num_heads=cfg.num_attention_heads, head_dim=cfg.head_dim,
                q_lora_rank=cfg.q_lora_rank, compress_ratio=ratio, index_n_heads=cfg.index_n_heads,
                index_head_dim=cfg.index_head_dim, o_groups=cfg.o_groups, o_lora_rank=cfg.o_lora_rank)


def v4_layer(cfg, ratio: int, seed: int = 0) -> DeepseekV4Attention:
    attn = DeepseekV4Attention(cfg, LAYER_OF_RATIO[ratio]).eval()
    _init_random(attn, seed)
    return attn


def v4_tables(cfg, ratio: int, maxpos: int):
    """The layer's RoPE tables as the runtime takes them, (maxpos, R) repeat-interleaved, from transformers' own
    rotary (rope_theta for sliding layers, compress_rope_theta for compressed ones)."""
    kind = "main" if ratio == 1 else "compress"
    cos, sin = DeepseekV4RotaryEmbedding(cfg)(torch.zeros(1), torch.arange(maxpos)[None], layer_type=kind)
    return cos[0].repeat_interleave(2, -1).contiguous(), sin[0].repeat_interleave(2, -1).contiguous()


def v4_forward(attn, cfg, x, topk=None, scores=None, selected=None):
    """transformers' layer over one request's tokens x (S, hidden) at positions 0..S-1 -> (S, hidden). C4 only:
    topk (S, K) compressed-row ids to use instead of its own indexer's; scores / selected: lists receiving its
    indexer's scores (S, S // 4) / its own selection (S, k)."""
    S = x.shape[0]
    pos = torch.arange(S)[None]
    rot = DeepseekV4RotaryEmbedding(cfg)
    pe = {k: rot(x[None], pos, layer_type=k) for k in ("main", "compress")}
    i = torch.arange(S)
    seen = (i[None, :] <= i[:, None]) & (i[None, :] > i[:, None] - cfg.sliding_window)
    mask = torch.zeros(S, S).masked_fill(~seen, float("-inf"))[None, None]
    hooks = []
    if topk is not None:
        hooks.append(attn.compressor.indexer.register_forward_hook(lambda m, a, o: topk[None].to(torch.int64)))
    if scores is not None:
        hooks.append(attn.compressor.indexer.scorer.register_forward_hook(lambda m, a, o: scores.append(o[0])))
    if selected is not None:
        hooks.append(attn.compressor.indexer.register_forward_hook(lambda m, a, o: selected.append(o[0])))
    try:
        with torch.no_grad():
            out, _ = attn(x[None], pe, pos, mask)
    finally:
        for h in hooks:
            h.remove()
    return out[0]


def run_v4(attn, cfg, ratio, K, seq_lens, *, dtype=torch.float32, state=None, seed=1):
    """The loaded layer on the runtime: one prefill step of every request's first S - 2 tokens, then two decode
    steps. -> (run, per request (S, hidden) outputs, per request (S, 1, K) top-k rows or None)."""
    g = torch.Generator().manual_seed(seed)
    xs = [torch.randn(S, cfg.hidden_size, generator=g) for S in seq_lens]
    d = ref.DsaDims(hidden=cfg.hidden_size, N=cfg.num_attention_heads, D=cfg.head_dim, R=cfg.qk_rope_head_dim,
                    q_lora=cfg.q_lora_rank, W=cfg.sliding_window, ratio=ratio, n_idx=cfg.index_n_heads,
                    Di=cfg.index_head_dim, K=K, G=cfg.o_groups, o_lora=cfg.o_lora_rank, eps=cfg.rms_norm_eps)
    state = attn.state_dict() if state is None else state
    w = aar.dsa.weights_from_checkpoint(state, **v4_dims(cfg, ratio))
    maxpos = max(seq_lens) + 8
    run = LayerRun(d, "a2", dtype, len(seq_lens), w=w, x=[x.to(dtype) for x in xs], rope=v4_tables(cfg, ratio, maxpos),
                   maxpos=maxpos)
    reqs = list(range(len(seq_lens)))
    outs = [[] for _ in reqs]
    tks = [[] for _ in reqs]
    for qlens in ([S - 2 for S in seq_lens], [1] * len(reqs), [1] * len(reqs)):
        out, qsl, _ = run.step(reqs, qlens)
        for b in reqs:
            outs[b].append(out[qsl[b]: qsl[b + 1]])
            if ratio == 4:
                tks[b].append(run.impl.last_topk[qsl[b]: qsl[b + 1]].clone())
    return run, xs, [torch.cat(o) for o in outs], [torch.cat(t) if t else None for t in tks]


def assert_rows_close(got, want, tol):
    torch.testing.assert_close(got.to(F64), want.to(F64), atol=tol * max(1.0, want.abs().max().item()), rtol=tol)


@pytest.mark.parametrize("ratio", [1, 4, 128])
def test_v4_layer_matches_transformers(ratio):
    # C4: index_topk above the compressed rows every query sees, so both indexers select all of them
    K = 64
    cfg = v4_config(K)
    attn = v4_layer(cfg, ratio)
    seq_lens = {1: [20, 13], 4: [23, 18], 128: [150, 129]}[ratio]  # C128: request 1 completes its row 0 decoding
    _, xs, outs, _ = run_v4(attn, cfg, ratio, K, seq_lens)
    for x, o in zip(xs, outs):
        assert_rows_close(o, v4_forward(attn, cfg, x), 2e-5)


def test_v4_c4_indexer_weights_select_transformers_topk():
    """index_topk below the visible compressed rows: the runtime's selection is transformers' top-k by its own
    scorer's scores (up to the int8 keys' quantisation), and the layer's output over that selection is
    transformers' output over it."""
    K = 2
    cfg = v4_config(K)
    attn = v4_layer(cfg, 4, seed=3)
    seq_lens = [29, 22]
    _, xs, outs, tks = run_v4(attn, cfg, 4, K, seq_lens)
    for x, o, tk in zip(xs, outs, tks):
        scores = []
        want = v4_forward(attn, cfg, x, topk=tk[:, 0], scores=scores)
        assert_rows_close(o, want, 2e-5)
        sc = scores[0].to(F64)
        for p in range(x.shape[0]):
            vis = (p + 1) // 4
            sel = [int(e) for e in tk[p, 0].tolist() if e >= 0]
            assert len(sel) == min(vis, K) and len(set(sel)) == len(sel) and all(e < vis for e in sel), (p, sel)
            rest = [c for c in range(vis) if c not in sel]
            if rest:
                margin = 0.05 * sc[p, :vis].abs().max().item() + 1e-6
                assert min(sc[p, e].item() for e in sel) >= max(sc[p, c].item() for c in rest) - margin, p
        # transformers' own indexer: where its selection is the runtime's, so is its output; elsewhere the two
        # differ only between rows of (near-)equal score (ReLU makes exact ties at 0; the runtime breaks them
        # toward the lower row), which the margin check above covers
        own_sel = []
        own = v4_forward(attn, cfg, x, selected=own_sel)
        same = [p for p in range(x.shape[0]) if set(tk[p, 0].tolist()) - {-1} == set(own_sel[0][p].tolist()) - {-1}]
        assert len(same) > x.shape[0] * 3 // 4
        assert_rows_close(o[same], own[same], 2e-5)

def test_v4_bf16_checkpoint_with_float32_norms():
    """A bf16 checkpoint keeps its norms, sinks and ape in float32 (as transformers does): the norms are cast to
    the projections' dtype, the sinks stay float32, and the bf16 layer matches transformers' fp32 layer over the
    same bf16-rounded weights."""
    cfg = v4_config(64)
    attn = v4_layer(cfg, 4)
    state = {k: (v.to(torch.bfloat16) if k.endswith("proj.weight") else v) for k, v in attn.state_dict().items()}
    w = aar.dsa.weights_from_checkpoint(state, **v4_dims(cfg, 4))
    assert w["wq_a"].dtype == w["q_norm"].dtype == w["cmp_norm"].dtype == w["idx_cmp_norm"].dtype == torch.bfloat16
    assert w["attn_sink"].dtype == w["cmp_ape"].dtype == torch.float32
    attn.load_state_dict({k: v.float() for k, v in state.items()})  # transformers over the same rounded weights
    _, xs, outs, _ = run_v4(attn, cfg, 4, 64, [23, 18], dtype=torch.bfloat16, state=state)
    for x, o in zip(xs, outs):
        assert_rows_close(o, v4_forward(attn, cfg, x.to(torch.bfloat16).float()), 3e-2)


# DeepSeek's published V4 names of a layer's keys (the names vLLM's loader reads; transformers' conversion mapping
# renames them to its own), written out here independently of the loader's table.
PUBLISHED = {
    "q_a_proj.weight": "wq_a.weight", "q_a_norm.weight": "q_norm.weight", "q_b_proj.weight": "wq_b.weight",
    "kv_proj.weight": "wkv.weight", "kv_norm.weight": "kv_norm.weight", "sinks": "attn_sink",
    "o_a_proj.weight": "wo_a.weight", "o_b_proj.weight": "wo_b.weight",
    "compressor.kv_proj.weight": "compressor.wkv.weight", "compressor.gate_proj.weight": "compressor.wgate.weight",
    "compressor.position_bias": "compressor.ape", "compressor.kv_norm.weight": "compressor.norm.weight",
    "compressor.indexer.q_b_proj.weight": "indexer.wq_b.weight",
    "compressor.indexer.scorer.weights_proj.weight": "indexer.weights_proj.weight",
    "compressor.indexer.kv_proj.weight": "indexer.compressor.wkv.weight",
    "compressor.indexer.gate_proj.weight": "indexer.compressor.wgate.weight",
    "compressor.indexer.position_bias": "indexer.compressor.ape",
    "compressor.indexer.kv_norm.weight": "indexer.compressor.norm.weight",
}


@pytest.mark.parametrize("ratio", [1, 4, 128])
def test_v4_published_names_and_prefix(ratio):
    cfg = v4_config(8)
    attn = v4_layer(cfg, ratio)
    hf = attn.state_dict()
    dims = v4_dims(cfg, ratio)
    # a model's state: the layer under its prefix next to other layers' keys, which are not read
    model = {f"model.layers.{LAYER_OF_RATIO[ratio]}.self_attn.{k}": v for k, v in hf.items()}
    model[f"model.layers.{LAYER_OF_RATIO[ratio]}0.self_attn.q_a_proj.weight"] = torch.zeros(1)
    model["model.embed_tokens.weight"] = torch.zeros(1)
    a = aar.dsa.weights_from_checkpoint(model, f"model.layers.{LAYER_OF_RATIO[ratio]}.self_attn", **dims)
    pub = {f"layers.7.attn.{PUBLISHED[k]}": v for k, v in hf.items()}
    b = aar.dsa.weights_from_checkpoint(pub, "layers.7.attn.", **dims)
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    # the projections are the checkpoint's tensors (views), wo_a the per-group transpose of o_a_proj
    assert a["wq_b"].data_ptr() == hf["q_b_proj.weight"].data_ptr()
    G, O = cfg.o_groups, cfg.o_lora_rank
    assert torch.equal(a["wo_a"], hf["o_a_proj.weight"].view(G, O, -1).transpose(1, 2))
    assert a["wo_a"].is_contiguous()
    expect = {"wq_a", "q_norm", "wq_b", "wkv", "kv_norm", "attn_sink", "wo_a", "wo_b"}
    if ratio > 1:
        expect |= {"cmp_wkv", "cmp_wgate", "cmp_ape", "cmp_norm"}
    if ratio == 4:
        expect |= {"idx_wq_b", "idx_weights_proj", "idx_cmp_wkv", "idx_cmp_wgate", "idx_cmp_ape", "idx_cmp_norm"}
    assert set(a) == expect


def test_v4_key_problems_name_the_key():
    cfg = v4_config(8)
    hf = v4_layer(cfg, 4).state_dict()
    dims = v4_dims(cfg, 4)
    pre = "model.layers.1.self_attn."
    full = {pre + k: v for k, v in hf.items()}

    missing = dict(full)
    del missing[pre + "compressor.indexer.position_bias"]
    with pytest.raises(ValueError, match=r"missing: 'model\.layers\.1\.self_attn\.compressor\.indexer\.position_bias'"):
        aar.dsa.weights_from_checkpoint(missing, pre, **dims)

    extra = dict(full)
    extra[pre + "compressor.indexer.rope_scale"] = torch.ones(1)
    with pytest.raises(ValueError, match=r"unexpected: 'model\.layers\.1\.self_attn\.compressor\.indexer\.rope_scale'"):
        aar.dsa.weights_from_checkpoint(extra, pre, **dims)

    wrong = dict(full)
    wrong[pre + "o_a_proj.weight"] = torch.zeros(32, 64)
    with pytest.raises(ValueError, match=r"'model\.layers\.1\.self_attn\.o_a_proj\.weight' is \(32, 64\), "
                                         r"expected \(32, 128\)"):
        aar.dsa.weights_from_checkpoint(wrong, pre, **dims)
    # the same state read with another layer's dims: every misshapen key is listed
    with pytest.raises(ValueError, match=r"q_b_proj\.weight' is \(256, 32\), expected \(512, 32\)"):
        aar.dsa.weights_from_checkpoint(full, pre, **dict(dims, num_heads=8))

    scaled = {**full, pre + "q_b_proj.weight_scale_inv": torch.ones(2, 1)}
    with pytest.raises(NotImplementedError, match=r"'model\.layers\.1\.self_attn\.q_b_proj\.weight_scale_inv' is a "
                                                  r"quantisation scale"):
        aar.dsa.weights_from_checkpoint(scaled, pre, **dims)
    with pytest.raises(ValueError, match=r"state_dict\['x'\] must be a torch\.Tensor"):
        aar.dsa.weights_from_checkpoint({**full, "x": 3}, pre, **dims)
    with pytest.raises(ValueError, match="compress_ratio must be 0 or 1"):
        aar.dsa.weights_from_checkpoint(full, pre, **dict(dims, compress_ratio=16))


# ----------------------------------------------------------------------------------------------------------------
# DeepSeek-V3.2 (SFA)


def v32_config(index_topk: int) -> DeepseekV32Config:
    cfg = DeepseekV32Config(hidden_size=64, num_attention_heads=4, num_key_value_heads=4, q_lora_rank=32,
                            kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=16, v_head_dim=16, index_n_heads=4,
                            index_head_dim=32, index_topk=index_topk, num_hidden_layers=1, vocab_size=128,
                            n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1, intermediate_size=64,
                            moe_intermediate_size=32)
    cfg._attn_implementation = "eager"
    return cfg


def v32_dims(cfg) -> dict:
    return dict(num_heads=cfg.num_attention_heads, hidden_size=cfg.hidden_size, q_lora_rank=cfg.q_lora_rank,
                kv_lora_rank=cfg.kv_lora_rank, qk_nope_head_dim=cfg.qk_nope_head_dim,
                qk_rope_head_dim=cfg.qk_rope_head_dim, v_head_dim=cfg.v_head_dim, index_n_head=cfg.index_n_heads,
                index_head_dim=cfg.index_head_dim)


def v32_forward(attn, cfg, x, selected):
    """transformers' layer over one request's tokens x (S, hidden) -> (S, hidden); selected receives its indexer's
    selection (S, k) (positions past a row's own are masked out of its attention)."""
    S = x.shape[0]
    pos = torch.arange(S)[None]
    pe = DeepseekV32RotaryEmbedding(cfg)(x[None], pos)
    mask = torch.full((S, S), float("-inf")).triu(1)[None, None]
    h = attn.indexer.register_forward_hook(lambda m, a, o: selected.append(o[0]))
    try:
        with torch.no_grad():
            out, _ = attn(x[None], pe, mask, position_ids=pos)
    finally:
        h.remove()
    return out[0]


@pytest.mark.parametrize("K", [5, 64])
def test_v32_layer_matches_transformers(K):
    """K = 5: the indexer selects fewer positions than most rows see (its weights decide the output); K = 64:
    every visible position."""
    cfg = v32_config(K)
    attn = DeepseekV32Attention(cfg, 0).eval()
    _init_random(attn, 0)
    prefix = "model.layers.0.self_attn."
    state = {prefix + k: v for k, v in attn.state_dict().items()}
    state["model.layers.1.self_attn.o_proj.weight"] = torch.zeros(1)  # another layer's: not read
    dims = v32_dims(cfg)
    w = aar.sfa.weights_from_checkpoint(state, prefix, **dims)
    assert w["q_proj"].data_ptr() == state[prefix + "q_b_proj.weight"].data_ptr()
    impl = aar.sfa.Impl(**dims, index_topk=K, scale=attn.scaling, **w)

    seq_lens, bs = [21, 14], 16
    g = torch.Generator().manual_seed(2)
    xs = [torch.randn(S, cfg.hidden_size, generator=g) for S in seq_lens]
    per_req = [math.ceil(S / bs) for S in seq_lens]
    nb = sum(per_req) + 1
    table = torch.zeros(len(seq_lens), max(per_req), dtype=torch.int32)
    start = 1  # block 0 unused
    for b, n in enumerate(per_req):
        table[b, :n] = torch.arange(start, start + n, dtype=torch.int32)
        start += n
    R = cfg.qk_rope_head_dim
    maxpos = max(seq_lens) + 8
    cos, sin = DeepseekV32RotaryEmbedding(cfg)(torch.zeros(1), torch.arange(maxpos)[None])
    builder = aar.sfa.MetadataBuilder(max_num_reqs=4, max_num_tokens=64, max_blocks_per_req=max(per_req), block_size=bs,
                                      num_blocks=nb, cos_table=cos[0].contiguous(), sin_table=sin[0].contiguous())
    caches = [torch.zeros(nb, bs, 1, cfg.kv_lora_rank), torch.zeros(nb, bs, 1, R),
              torch.zeros(nb, bs, 1, cfg.index_head_dim)]
    done = [0] * len(seq_lens)
    outs = [[] for _ in seq_lens]
    tks = [[] for _ in seq_lens]
    for qlens in ([S - 2 for S in seq_lens], [1, 1], [1, 1]):
        S_now = [d + q for d, q in zip(done, qlens)]
        qsl = torch.tensor([0] + torch.tensor(qlens).cumsum(0).tolist(), dtype=torch.int32)
        md = builder.build(qsl, torch.tensor(S_now, dtype=torch.int32), table)
        hidden = torch.cat([x[d:s] for x, d, s in zip(xs, done, S_now)])
        out = torch.full_like(hidden, float("nan"))
        impl.forward(hidden, caches, md, out)
        for b in range(len(seq_lens)):
            outs[b].append(out[qsl[b]: qsl[b + 1]])
            tks[b].append(impl.last_topk[qsl[b]: qsl[b + 1], 0].clone())
        done = S_now
    for x, o, tk in zip(xs, outs, tks):
        selected = []
        want = v32_forward(attn, cfg, x, selected)
        # both indexers select the same positions (fp32 scores; these seeds have no tie at the K-th place)
        tk = torch.cat(tk)
        for p in range(x.shape[0]):
            assert set(tk[p].tolist()) - {-1} == {int(e) for e in selected[0][p] if e <= p}, p
        assert_rows_close(torch.cat(o), want, 2e-5)


def test_v32_key_problems_name_the_key():
    cfg = v32_config(8)
    attn = DeepseekV32Attention(cfg, 0)
    full = dict(attn.state_dict())
    dims = v32_dims(cfg)

    missing = {k: v for k, v in full.items() if k != "indexer.k_norm.bias"}
    with pytest.raises(ValueError, match=r"missing: 'indexer\.k_norm\.bias' \(32,\)"):
        aar.sfa.weights_from_checkpoint(missing, **dims)
    with pytest.raises(ValueError, match=r"unexpected: 'indexer\.k_norm\.bias', 'indexer\.k_norm\.weight'"):
        aar.sfa.weights_from_checkpoint(full, **dict(dims, index_n_head=None))  # a layer without an indexer
    wrong = {**full, "kv_b_proj.weight": torch.zeros(128, 31)}
    with pytest.raises(ValueError, match=r"'kv_b_proj\.weight' is \(128, 31\), expected \(128, 32\)"):
        aar.sfa.weights_from_checkpoint(wrong, **dims)
    biased = {**full, "o_proj.bias": torch.zeros(64)}
    with pytest.raises(NotImplementedError, match=r"'o_proj\.bias' is a bias"):
        aar.sfa.weights_from_checkpoint(biased, **dims)
    fp8 = {**full, "o_proj.weight": full["o_proj.weight"].to(torch.float8_e4m3fn)}
    with pytest.raises(NotImplementedError, match=r"'o_proj\.weight' is Float8_e4m3fn"):
        aar.sfa.weights_from_checkpoint(fp8, **dims)
    # without q-LoRA the query projection is q_proj.weight
    no_lora = {k: v for k, v in full.items() if not k.startswith("q_")}
    no_lora["q_proj.weight"] = torch.zeros(4 * 32, 64)
    no_lora["indexer.wq_b.weight"] = torch.zeros(4 * 32, 64)
    w = aar.sfa.weights_from_checkpoint(no_lora, **dict(dims, q_lora_rank=None))
    assert "q_a_proj" not in w and w["q_proj"].data_ptr() == no_lora["q_proj.weight"].data_ptr()
