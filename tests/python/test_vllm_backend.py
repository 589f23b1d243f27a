"""The vLLM v1 attention-backend adapter (ascend_attn_rt.vllm) on vLLM 0.27.1's own
CommonAttentionMetadata, checked against the float64 reference.

The builder is given a stand-in for VllmConfig (the fields it reads); building a real
VllmConfig from tests/python/data/vllm_tiny_gqa is still to do (see the report)."""

from types import SimpleNamespace

import pytest
import torch

vllm_backend = pytest.importorskip("vllm.v1.attention.backend", reason="vLLM 0.27.1 not importable")
from vllm.v1.attention.backend import CommonAttentionMetadata  # noqa: E402
from vllm.v1.kv_cache_interface import FullAttentionSpec  # noqa: E402

from ascend_attn_rt.vllm import AscendAttnRtBackend  # noqa: E402
from _reference import assert_close, make_batch, new_output  # noqa: E402

N, NKV, D, BS = 8, 2, 32, 16


def _config(num_blocks):
    return SimpleNamespace(
        scheduler_config=SimpleNamespace(max_num_seqs=8, max_num_batched_tokens=512, enable_chunked_prefill=True),
        cache_config=SimpleNamespace(num_gpu_blocks=num_blocks),
        model_config=SimpleNamespace(max_model_len=512),
        speculative_config=None,
    )


@pytest.mark.parametrize("seq_lens,q_lens", [
    ([17, 40, 5], [1, 1, 1]),          # decode
    ([9, 30], [9, 30]),                # prefill
    ([40, 70], [8, 20]),               # chunked prefill
    ([33, 12, 50], [1, 1, 14]),        # mixed
])
def test_builder_and_forward(seq_lens, q_lens):
    gen = torch.Generator().manual_seed(7)
    b = make_batch(seq_lens, q_lens, num_heads=N, num_kv_heads=NKV, head_size=D, dtype=torch.float16,
                   block_size=BS, gen=gen, width=512 // BS)
    spec = FullAttentionSpec(block_size=BS, num_kv_heads=NKV, head_size=D, dtype=torch.float16)
    builder = AscendAttnRtBackend.get_builder_cls()(spec, ["l0"], _config(b.num_blocks), torch.device("cpu"))
    cam = CommonAttentionMetadata(
        query_start_loc=b.query_start_loc, query_start_loc_cpu=b.query_start_loc,
        seq_lens=b.seq_lens_t, num_reqs=b.num_reqs, num_actual_tokens=b.num_actual_tokens,
        max_query_len=max(q_lens), max_seq_len=max(seq_lens), block_table_tensor=b.block_table,
        slot_mapping=torch.tensor(b.new_slots, dtype=torch.int64), _seq_lens_cpu=b.seq_lens_t)
    md = builder.build(0, cam)
    impl = AscendAttnRtBackend.get_impl_cls()(N, D, D ** -0.5, NKV)
    shape = AscendAttnRtBackend.get_kv_cache_shape(b.num_blocks, BS, NKV, D)
    kv_cache = torch.stack([b.key_cache, b.value_cache])
    assert tuple(kv_cache.shape) == shape
    out = new_output(b).view(b.q.shape[0], N * D)
    impl.forward(None, b.q.view(-1, N * D), b.k.view(-1, NKV * D), b.v.view(-1, NKV * D), kv_cache, md, out)
    n = b.num_actual_tokens
    assert_close(out.view(-1, N, D)[:n], b.reference(), torch.float16)


def test_refusals():
    with pytest.raises(NotImplementedError, match="output_scale"):
        AscendAttnRtBackend.get_impl_cls()(N, D, 1.0, NKV).forward(
            None, None, None, None, None, None, None, output_scale=torch.ones(1))
    assert AscendAttnRtBackend.get_name() == "CUSTOM"
