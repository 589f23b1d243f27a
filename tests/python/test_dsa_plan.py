"""The DSA plan layer from Python (aar.dsa): the attention-KV plan of docs/design/dsa.md §4.1 / §4.2, the backend
descriptors of docs/design/dsa.md §2.1 and the cache specs of docs/design/dsa.md §2.2. The tables are checked row by row in the GoogleTests
(tests/cpp/test_plan_dsa_kv_plan.cpp); here: the facade converts every field and names bad arguments."""

import pytest

import ascend_attn_rt as aar

dsa = aar.dsa


@pytest.mark.parametrize("device,cache,want", [
    ("a2", None, "bfloat16"), ("a3", "float8_e4m3fn", "bfloat16"), ("a5", None, "float8_e4m3fn"),
    ("a5", "auto", "float8_e4m3fn"), ("a5", "bfloat16", "bfloat16"), ("a5", "float8_e4m3fn", "float8_e4m3fn"),
])
def test_resolve_attn_kv_dtype(device, cache, want):
    assert dsa.resolve_attn_kv_dtype(device, cache) == want


def test_the_three_plans():
    base = dsa.make_attn_kv_plan(device_kind="a2")
    assert (base["sparse_attn_op"], base["layout_kv"], base["slot_format"], base["kv_scatter"]) == (
        "npu_sparse_attn_sharedkv", "PA_ND", "BLOCK_OFFSET", "npu_scatter_nd_update_v2")
    assert base["attn_head_bytes"] == 1024 and base["indexer_k_dtype"] == "int8"
    assert base["compressor_slot_format_code"] == 2 and base["passes_device_kwarg"]
    a5 = dsa.make_attn_kv_plan(device_kind="a5")
    assert a5["sparse_attn_op"] == "npu_kv_quant_sparse_attn_sharedkv" and a5["attn_head_bytes"] == 640
    assert a5["compressor_slot_format_code"] == 1 and a5["kv_quant_mode"] == 1 and a5["tile_size"] == 64
    assert a5["indexer_k_dtype"] == "float8_e4m3fn" and a5["indexer_full_view"]
    bf = dsa.make_attn_kv_plan(device_kind="a5", cache_dtype="bfloat16")
    assert bf["uses_sparse_flash_mla"] and bf["layout_kv"] == "PA_BBND" and bf["attn_kv_dtype"] == "bfloat16"
    assert (a5["slot_format"], a5["kv_scatter"], a5["o_proj"]) == ("FLAT", "kv_compress_epilog", "MxFp8QuantBmm")
    assert (bf["slot_format"], bf["kv_scatter"]) == ("BLOCK_OFFSET", "npu_scatter_nd_update_")
    # docs/design/dsa.md §4.2: (-1, -1) skip rows; the device allows the MX-fp8 o_proj on both A5 plans (the layer takes it
    # only for a checkpoint with wo_a's MX scale), never on A2/A3
    assert (bf["block_offset_skip"], base["block_offset_skip"]) == ("MinusOne", "LastOffset")
    assert (bf["o_proj"], base["o_proj"]) == ("MxFp8QuantBmm", "Bmm")


def test_backends_and_cache_specs():
    assert dsa.backend("c4")["name"] == "ASCEND_DSA_C4"
    assert dsa.backend("c4")["kernel_block_sizes"] == [128, 256, 512]
    assert dsa.backend("c128_state", "a5")["kernel_block_sizes"] == [4, 8, 16]
    assert dsa.backend("c128_state", "a2")["kernel_block_sizes"] == [8, 16, 32]
    swa = dsa.cache_spec("swa", 128, num_blocks=10)
    assert swa["page_bytes"] == 131072 and swa["shape"] == [10, 128, 1, 512] and swa["dtype"] == "bfloat16"
    assert dsa.cache_spec("swa", 128, device_kind="a5")["page_bytes"] == 81920
    c4 = dsa.cache_spec("c4_kv", 128)
    assert c4["block_size"] == 512 and c4["storage_block_size"] == 128
    idx = dsa.cache_spec("c4_indexer_k", 128, num_blocks=3)
    assert idx["page_bytes"] == 16640 and idx["scale_dim"] == 1 and idx["scale_shape"][0] == 3
    assert dsa.cache_spec("c4_indexer_k", 128, device_kind="a5")["page_bytes"] == 16896


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="cache_dtype"):
        dsa.make_attn_kv_plan(device_kind="a5", cache_dtype="float7")
    with pytest.raises(ValueError, match="device_kind"):
        dsa.make_attn_kv_plan(device_kind="a9")
    with pytest.raises(NotImplementedError, match="310P"):
        dsa.make_attn_kv_plan(device_kind="310p")
    with pytest.raises(ValueError, match="kind"):
        dsa.cache_spec("c8_kv", 128)
    with pytest.raises(ValueError, match="96"):
        dsa.cache_spec("swa", 96)
    with pytest.raises(ValueError, match="model_dtype"):
        dsa.make_attn_kv_plan(model_dtype="float64")


def test_cache_spec_for_the_models_dims():
    # The seven caches of a model come from the runtime for its dims (defaults: DeepSeek-V4's).
    kw = dict(head_dim=64, rope_dim=16, index_head_dim=32, num_blocks=5)
    shapes = {k: dsa.cache_spec(k, 32, **kw)["shape"] for k in
              ("swa", "c4_kv", "c128_kv", "c4_indexer_k", "c4_attn_state", "c4_indexer_state", "c128_state")}
    assert shapes == {"swa": [5, 32, 1, 64], "c4_kv": [5, 32, 1, 64], "c128_kv": [5, 32, 1, 64],
                      "c4_indexer_k": [5, 32, 1, 32], "c4_attn_state": [5, 2, 256], "c4_indexer_state": [5, 2, 128],
                      "c128_state": [5, 8, 128]}
    idx = dsa.cache_spec("c4_indexer_k", 32, **kw)
    assert idx["scale_shape"] == [5, 32, 1] and idx["view"]["shape"] == [5, 32, 1, 32] and "full_view" not in idx
    # at DeepSeek-V4's dims, the cache table of docs/design/dsa.md (state caches in the compressor's (nb, rows, 2 coff D) layout)
    assert dsa.cache_spec("c4_attn_state", 128, num_blocks=2)["shape"] == [2, 8, 2048]
    assert dsa.cache_spec("swa", 128, num_blocks=2)["shape"] == [2, 128, 1, 512]
    a5 = dsa.cache_spec("c4_indexer_k", 32, device_kind="a5", cache_dtype="bfloat16", **kw)
    assert a5["full_view"]["shape"] == [5, 32, 1, 36] and a5["scale_view"]["dtype"] == "float32"
    with pytest.raises(ValueError, match="640-byte fp8 rows hold head_dim 512 and rope_dim 64"):
        dsa.cache_spec("swa", 32, device_kind="a5", **kw)
    with pytest.raises(ValueError, match="rope_dim=15"):
        dsa.cache_spec("swa", 32, head_dim=64, rope_dim=15)
    with pytest.raises(ValueError, match="index_head_dim must be positive"):
        dsa.cache_spec("c4_indexer_k", 32, index_head_dim=0)


def _dsa_doc_section():
    import pathlib

    doc = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "python_api.md").read_text()
    start = doc.index("## DSA backend (`ascend_attn_rt.dsa`)")
    return doc[start: doc.index("\n## ", start + 1)]


def test_every_public_name_of_aar_dsa_is_documented():
    import re

    sec = _dsa_doc_section()
    documented = set(re.findall(r"`dsa\.([A-Za-z_]\w*)", sec))
    public = {n for n in dir(dsa) if not n.startswith("_")}
    assert public == documented, (public - documented, documented - public)


def test_the_documented_dsa_example_runs():
    sec = _dsa_doc_section()
    code = sec[sec.index("```python\n") + len("```python\n"): sec.index("```", sec.index("```python\n") + 3)]
    scope = {}
    exec(compile(code, "docs/python_api.md (DSA example)", "exec"), scope)
    routed = scope["routed"]
    assert isinstance(routed, dsa.LayerMetadata) and routed.common is scope["md"]["c4_kv"]
