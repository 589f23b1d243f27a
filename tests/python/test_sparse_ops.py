"""The sparse-attention and quantisation operators of issue 10 as Python sees them through the dispatcher:
the no-compute kernels of both libraries (``torch.ops.ascend_noop`` for torch_npu's operators,
``torch.ops.ascend_noop_va`` for vllm-ascend's ``_C_ascend`` ones) return correctly shaped outputs on CPU and
meta tensors, and the CPU twins answer a small case (their maths is tested in tests/cpp/test_rt_ops_sparse.cpp
and test_rt_ops_quant.cpp against float64 references)."""

import pytest
import torch

import ascend_attn_rt  # noqa: F401  (registers the namespaces)

T, N, K, NB, BS = 5, 4, 16, 6, 8


def _t(shape, dtype, device):
    if device == "meta":
        return torch.empty(shape, dtype=dtype, device="meta")
    if dtype in (torch.int8, torch.int32, torch.int64):
        return torch.zeros(shape, dtype=dtype)
    return torch.randn(shape).to(dtype)


def _lens(device):
    return _t((2,), torch.int32, device), _t((2,), torch.int32, device), _t((2, 3), torch.int32, device)


@pytest.fixture(autouse=True)
def _inference():
    with torch.inference_mode():
        yield


@pytest.mark.parametrize("device", ["cpu", "meta"])
@pytest.mark.parametrize("ns", ["ascend_noop", "ascend_noop_va"])
def test_noop_lightning_indexer_shapes(ns, device):
    asq, ask, bt = _lens(device)
    q, k, w = _t((T, 64, 128), torch.bfloat16, device), _t((NB, BS, 1, 128), torch.bfloat16, device), \
        _t((T, 64), torch.bfloat16, device)
    op = getattr(torch.ops, ns).npu_lightning_indexer
    idx, val = op(q, k, w, actual_seq_lengths_query=asq, actual_seq_lengths_key=ask, block_table=bt,
                  layout_query="TND", layout_key="PA_BSND", sparse_count=K)
    assert idx.shape == (T, 1, K) and idx.dtype == torch.int32 and idx.device.type == device
    assert val.numel() == 0
    idx, val = op(q, k, w, actual_seq_lengths_query=asq, actual_seq_lengths_key=ask, block_table=bt,
                  layout_query="TND", layout_key="PA_BSND", sparse_count=K, return_value=True)
    assert val.shape == (T, 1, K) and val.dtype == torch.float32

    qq, kq = _t((T, 64, 128), torch.int8, device), _t((NB, BS, 1, 128), torch.int8, device)
    qs, ks, wh = _t((T, 64), torch.float16, device), _t((NB, BS, 1), torch.float16, device), \
        _t((T, 64), torch.float16, device)
    if ns == "ascend_noop":
        idx = torch.ops.ascend_noop.npu_quant_lightning_indexer(
            qq, kq, wh, qs, ks, 0, 0, actual_seq_lengths_query=asq, actual_seq_lengths_key=ask, block_table=bt,
            layout_query="TND", layout_key="PA_BSND", sparse_count=K)
    else:
        idx = torch.ops.ascend_noop_va.npu_lightning_indexer_quant(
            qq, kq, wh, qs, ks, actual_seq_lengths_query=asq, actual_seq_lengths_key=ask, block_table=bt,
            layout_query="TND", layout_key="PA_BSND", sparse_count=K)
    assert idx.shape == (T, 1, K) and idx.dtype == torch.int32 and idx.device.type == device


@pytest.mark.parametrize("device", ["cpu", "meta"])
@pytest.mark.parametrize("ns", ["ascend_noop", "ascend_noop_va"])
@pytest.mark.parametrize("lse", [False, True])
def test_noop_sparse_flash_attention_shapes(ns, device, lse):
    asq, ask, bt = _lens(device)
    q, kv = _t((T, N, 512), torch.bfloat16, device), _t((NB, BS, 1, 512), torch.bfloat16, device)
    qr, kr = _t((T, N, 64), torch.bfloat16, device), _t((NB, BS, 1, 64), torch.bfloat16, device)
    idx = _t((T, 1, K), torch.int32, device)
    out, smax, ssum = getattr(torch.ops, ns).npu_sparse_flash_attention(
        q, kv, kv, idx, 0.04, block_table=bt, actual_seq_lengths_query=asq, actual_seq_lengths_kv=ask,
        query_rope=qr, key_rope=kr, layout_query="TND", layout_kv="PA_BSND", attention_mode=2,
        return_softmax_lse=lse)
    assert out.shape == (T, N, 512) and out.dtype == torch.bfloat16 and out.device.type == device
    if lse:
        assert smax.shape == ssum.shape == (1, T, N) and smax.dtype == ssum.dtype == torch.float32
    else:
        assert smax.numel() == ssum.numel() == 0

    q8, rows = _t((T, N, 576), torch.bfloat16, device), _t((NB, BS, 1, 656), torch.int8, device)
    if ns == "ascend_noop":  # torch_npu's returns the output only (no return_softmax_lse argument)
        out = torch.ops.ascend_noop.npu_kv_quant_sparse_flash_attention(
            q8, rows, rows, idx, 0.04, 2, 2, block_table=bt, actual_seq_lengths_query=asq,
            actual_seq_lengths_kv=ask, layout_query="TND", layout_kv="PA_BSND", attention_mode=2)
        assert isinstance(out, torch.Tensor)
    else:
        out, smax, ssum = torch.ops.ascend_noop_va.npu_kv_quant_sparse_flash_attention(
            q8, rows, rows, idx, 0.04, key_quant_mode=2, value_quant_mode=2, block_table=bt,
            actual_seq_lengths_query=asq, actual_seq_lengths_kv=ask, layout_query="TND", layout_kv="PA_BSND",
            return_softmax_lse=lse)
        if lse:
            assert smax.shape == (1, T, N)
    assert out.shape == (T, N, 512) and out.dtype == torch.bfloat16 and out.device.type == device


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_noop_quant_and_scatter_shapes(device):
    noop = torch.ops.ascend_noop
    x = _t((3, 7, 256), torch.bfloat16, device)
    q, scale = noop.npu_dynamic_quant(x)
    assert q.shape == x.shape and q.dtype == torch.int8 and scale.shape == (3, 7) and scale.dtype == torch.float32
    q, scale = noop.npu_dynamic_quant(x, dst_type=24)  # at::ScalarType::Float8_e4m3fn
    assert q.dtype == torch.float8_e4m3fn
    y, s = noop.npu_dynamic_block_quant(_t((T, 1, 512), torch.bfloat16, device))
    assert y.shape == (T, 1, 512) and y.dtype == torch.int8 and s.shape == (T, 1, 4) and s.dtype == torch.float32
    y, s = noop.npu_dynamic_block_quant(_t((3, 300), torch.bfloat16, device))
    assert s.shape == (3, 3)
    cache = _t((NB * BS, 128), torch.bfloat16, device)
    before = None if device == "meta" else cache.clone()
    r = noop.npu_scatter_nd_update_(cache, _t((4, 1), torch.int64, device), _t((4, 128), torch.bfloat16, device))
    assert r.shape == cache.shape and r.data_ptr() == cache.data_ptr()
    if before is not None:
        assert torch.equal(cache, before)  # no compute: nothing written
    c = _t((T, N, 128), torch.bfloat16, device)
    before = None if device == "meta" else c.clone()
    assert torch.ops.ascend_noop_va.batch_matmul_transpose(
        _t((T, N, 512), torch.bfloat16, device), _t((N, 512, 128), torch.bfloat16, device), c) is None
    if before is not None:
        assert torch.equal(c, before)


def test_cpu_twins_answer_through_the_dispatcher():
    # A tiny indexer case (one request, 3 keys, row sees all): scores 3, 1, 2 -> [0, 2, 1, -1].
    q = torch.tensor([[[1.0, 0.0]]])  # (T=1, H=1, D=2)
    keys = torch.tensor([[3.0, 0.0], [1.0, 0.0], [2.0, 0.0]])
    cache = torch.zeros(2, 2, 1, 2)
    cache[1, :, 0] = keys[:2]
    cache[0, 0, 0] = keys[2]
    bt = torch.tensor([[1, 0]], dtype=torch.int32)
    w = torch.ones(1, 1)
    lens_q, lens_k = torch.tensor([1], dtype=torch.int32), torch.tensor([3], dtype=torch.int32)
    for ns in ("ascend_cpu", "ascend_cpu_va"):
        idx, _ = getattr(torch.ops, ns).npu_lightning_indexer(
            q, cache, w, actual_seq_lengths_query=lens_q, actual_seq_lengths_key=lens_k, block_table=bt,
            layout_query="TND", layout_key="PA_BSND", sparse_count=4)
        assert idx.tolist() == [[[0, 2, 1, -1]]], ns
    # batch_matmul_transpose writes its third argument.
    a, b = torch.randn(3, 2, 4), torch.randn(2, 4, 5)
    c = torch.empty(3, 2, 5)
    torch.ops.ascend_cpu_va.batch_matmul_transpose(a, b, c)
    torch.testing.assert_close(c, torch.einsum("tnl,nlv->tnv", a, b))
    # The twins' errors reach Python as exceptions naming the argument.
    with pytest.raises(Exception, match="sinks"):
        torch.ops.ascend_cpu.npu_sparse_flash_attention(
            torch.randn(1, 1, 8), cache.new_zeros(2, 2, 1, 8), None, torch.zeros(1, 1, 1, dtype=torch.int32), 1.0,
            block_table=bt, actual_seq_lengths_query=lens_q, actual_seq_lengths_kv=lens_k, layout_query="TND",
            layout_kv="PA_BSND", attention_mode=2, sinks=torch.zeros(1))
