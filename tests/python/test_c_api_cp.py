"""The C ABI's communicator over a group torch.distributed made (aar_cp_comm_create_from_group,
include/ascend_attn_rt/c_api.h; docs/design/c_api.md §6.1), driven through ctypes as a C engine
embedded next to torch would: two gloo ranks, each finds the world group by its group_name in
c10d's registry, runs a GQA DCP prefill and decode through the C functions (DLPack tensors from
torch), and checks the decode (the collectives' path) against a float64 attention over the whole
sequence. Also: the pointer check (a wrong c10d::ProcessGroup* is refused by name), and version
5's PCP functions (aar_gqa_pcp_builder_create_ext, the capture build, aar_graph_update_gqa_pcp) in
one process: the struct layouts as a C caller declares them, a padded speculative decode bucket's
local rows, and the refusals by name with nothing written.

The C ABI's own error paths are tests/cpp/test_c_api_cp.cpp; its two-process TCP path is
examples/c/c_gqa_cp.c (ctest example_c_gqa_cp).
"""

import ctypes
import math
import os
import pathlib

import pytest
import torch

from _cp_harness import run_ranks

dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

ROOT = pathlib.Path(__file__).resolve().parents[2]
LIB = pathlib.Path(os.environ.get("AAR_BUILD_DIR", ROOT / "build")) / "libascend_attn_rt_c.so"
if not LIB.exists():
    pytest.skip(f"no C ABI library at {LIB} (build first, or set AAR_BUILD_DIR)", allow_module_level=True)

H, HKV, D, BS, NB, MAXB = 2, 1, 16, 16, 4, 2
i32, i64, sz, vp = ctypes.c_int32, ctypes.c_int64, ctypes.c_size_t, ctypes.c_void_p


class CommInfo(ctypes.Structure):
    _fields_ = [("struct_size", sz), ("rank", i32), ("world_size", i32), ("calls", i64)]


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", i32), ("device_id", i32)]


class DcpBuilderConfig(ctypes.Structure):
    _fields_ = [("struct_size", sz)] + [(n, i32) for n in (
        "max_num_reqs", "max_num_tokens", "max_blocks_per_req", "block_size", "num_blocks", "num_speculative_tokens",
        "dcp_world_size", "dcp_rank", "interleave", "pd_recompute_scheduler")] + [
        ("device", DLDevice), ("separate_device_buffers", i32), ("staging_buffers", i32)]


class DcpBuildInputs(ctypes.Structure):
    _fields_ = [("struct_size", sz), ("query_start_loc", vp), ("query_start_loc_len", sz), ("seq_lens", vp),
                ("seq_lens_len", sz), ("block_table", vp), ("block_table_len", sz), ("block_table_stride", i32),
                ("num_input_tokens", i32), ("is_prefilling", vp), ("is_prefilling_len", sz), ("draft_step", i32)]


class GqaImplConfig(ctypes.Structure):
    _fields_ = [("struct_size", sz), ("num_heads", i64), ("head_size", i64), ("scale", ctypes.c_double),
                ("num_kv_heads", i64), ("sliding_window", i64), ("sinks", vp), ("has_alibi_slopes", i32),
                ("logits_soft_cap", ctypes.c_double), ("kv_cache_dtype", ctypes.c_char_p), ("attn_type", i32),
                ("kv_sharing", i32), ("device_kind", i32), ("has_speculative_config", i32),
                ("full_decode_only_graph", i32), ("pa_shape_list", vp), ("pa_shape_list_len", sz),
                ("layer_index", i64), ("kv_cache_group", i32)]


def _lib():
    lib = ctypes.CDLL(str(LIB))
    lib.aar_last_error.restype = ctypes.c_char_p
    lib.aar_cp_comm_create_from_group.argtypes = [ctypes.c_char_p, vp, i64, ctypes.POINTER(vp)]
    for f in ("aar_gqa_dcp_builder_build", "aar_gqa_dcp_builder_create", "aar_gqa_dcp_impl_create",
              "aar_cp_comm_get_info", "aar_gqa_dcp_impl_forward"):
        getattr(lib, f).restype = ctypes.c_int
    lib.aar_gqa_dcp_impl_forward.argtypes = [vp] * 8  # pointers given as ints: never narrowed to a C int
    return lib


def _dl(t):
    """The DLManagedTensor* of a DLPack capsule of t, and the capsule (keep it alive: it frees it)."""
    cap = torch.utils.dlpack.to_dlpack(t)
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = vp, [ctypes.py_object, ctypes.c_char_p]
    return get(cap, b"dltensor"), cap


def _check(lib, status, what):
    assert status == 0, f"{what}: status {status}: {lib.aar_last_error().decode()}"


def _inputs(qsl, seq, table, pref):
    arrays = [torch.tensor(qsl, dtype=torch.int32), torch.tensor(seq, dtype=torch.int32),
              torch.tensor(table, dtype=torch.int32), torch.tensor(pref, dtype=torch.uint8)]
    ins = DcpBuildInputs(struct_size=ctypes.sizeof(DcpBuildInputs), query_start_loc=arrays[0].data_ptr(),
                         query_start_loc_len=len(qsl), seq_lens=arrays[1].data_ptr(), seq_lens_len=len(seq),
                         block_table=arrays[2].data_ptr(), block_table_len=len(table), block_table_stride=MAXB,
                         is_prefilling=arrays[3].data_ptr(), is_prefilling_len=len(pref), draft_step=-1)
    return ins, arrays


def _case(rank, world):
    torch.set_num_threads(1)
    lib = _lib()
    pg = dist.group.WORLD
    name = pg.group_name.encode()
    comm = vp()
    # The pointer form: anything but the registered object is refused, the pointer never read.
    bogus = ctypes.c_int(0)
    st = lib.aar_cp_comm_create_from_group(name, ctypes.addressof(bogus), 20000, ctypes.byref(comm))
    assert st == 1 and b"is not the c10d::ProcessGroup registered under" in lib.aar_last_error(), st
    assert not comm.value
    _check(lib, lib.aar_cp_comm_create_from_group(name, None, 20000, ctypes.byref(comm)), "create_from_group")
    info = CommInfo(struct_size=ctypes.sizeof(CommInfo))
    _check(lib, lib.aar_cp_comm_get_info(comm, ctypes.byref(info)), "get_info")
    assert (info.rank, info.world_size, info.calls) == (rank, world, 0)

    bc = DcpBuilderConfig()
    lib.aar_gqa_dcp_builder_config_init(ctypes.byref(bc))
    bc.max_num_reqs, bc.max_num_tokens, bc.max_blocks_per_req, bc.block_size, bc.num_blocks = 2, 32, MAXB, BS, NB
    bc.dcp_world_size, bc.dcp_rank = world, rank
    builder = vp()
    _check(lib, lib.aar_gqa_dcp_builder_create(ctypes.byref(bc), ctypes.byref(builder)), "builder_create")
    ic = GqaImplConfig()
    lib.aar_gqa_impl_config_init(ctypes.byref(ic))
    ic.num_heads, ic.num_kv_heads, ic.head_size = H, HKV, D
    layer = vp()
    _check(lib, lib.aar_gqa_dcp_impl_create(ctypes.byref(ic), comm, ctypes.byref(layer)), "impl_create")

    g = torch.Generator().manual_seed(5)
    n = 21  # a prefill of 20 tokens, then one decode
    q_all = torch.randn(n, world * H, D, generator=g)
    k, v = torch.randn(n, HKV, D, generator=g), torch.randn(n, HKV, D, generator=g)
    q = q_all[:, rank * H:(rank + 1) * H].contiguous()
    kc, vc = torch.zeros(NB, BS, HKV, D), torch.zeros(NB, BS, HKV, D)
    worst = 0.0
    for rows, qsl, seq, pref in ((slice(0, 20), [0, 20], [20], [1]), (slice(20, 21), [0, 1], [21], [0])):
        ins, keep = _inputs(qsl, seq, [1, 2], pref)
        md = vp()
        _check(lib, lib.aar_gqa_dcp_builder_build(builder, ctypes.byref(ins), ctypes.byref(md)), "build")
        out = torch.full((rows.stop - rows.start, H, D), float("nan"))
        tensors = [_dl(t) for t in (q[rows].contiguous(), k[rows].contiguous(), v[rows].contiguous(), kc, vc, out)]
        p = [t[0] for t in tensors]
        _check(lib, lib.aar_gqa_dcp_impl_forward(layer, p[0], p[1], p[2], p[3], p[4], md, p[5]), "forward")
        # float64 reference: causal over the whole sequence, this rank's heads (one KV head).
        for i, pos in enumerate(range(rows.start, rows.stop)):
            s = torch.einsum("hd,ld->hl", q[pos].double(), k[:pos + 1, 0].double()) / math.sqrt(D)
            ref = torch.softmax(s, -1) @ v[:pos + 1, 0].double()
            worst = max(worst, float((out[i].double() - ref).abs().max()))
        del tensors, keep
    _check(lib, lib.aar_cp_comm_get_info(comm, ctypes.byref(info)), "get_info")
    assert info.calls == 2, info.calls  # the decode's query gather and all-to-all; the fresh prefill none
    lib.aar_cp_comm_destroy(comm)  # before the layer: the layer holds the group until it goes
    lib.aar_gqa_dcp_impl_destroy(layer)
    lib.aar_gqa_dcp_builder_destroy(builder)
    return worst


def test_dcp_through_the_c_abi_on_a_torch_distributed_group():
    worst = run_ranks(2, _case, deadline_s=90.0)
    assert all(w < 1e-5 for w in worst), worst


class PcpBuilderConfig(ctypes.Structure):
    _fields_ = [("struct_size", sz)] + [(n, i32) for n in (
        "max_num_reqs", "max_num_tokens", "max_blocks_per_req", "block_size", "num_blocks", "pcp_size", "pcp_rank",
        "dcp_size", "dcp_rank", "interleave_size", "kv_mode")] + [
        ("device", DLDevice), ("separate_device_buffers", i32), ("staging_buffers", i32)]


class PcpBuilderExt(ctypes.Structure):
    _fields_ = [("struct_size", sz), ("num_speculative_tokens", i32)]


class PcpBuildInputs(ctypes.Structure):
    _fields_ = [("struct_size", sz), ("query_start_loc", vp), ("query_start_loc_len", sz), ("seq_lens", vp),
                ("seq_lens_len", sz), ("block_table", vp), ("block_table_len", sz), ("block_table_stride", i32),
                ("num_input_tokens", i32), ("is_prefilling", vp), ("is_prefilling_len", sz)]


def test_pcp_spec_and_capture_functions_through_ctypes():
    """Version 5's PCP functions from a C caller's side (one process, no collective): the ext
    struct's checks, the capture build of a speculative decode bucket (padding rows -1 in the
    local rows), and what the capture build and the update refuse, each naming the argument with
    nothing written."""
    lib = _lib()
    assert lib.aar_c_api_version() == 7
    bc = PcpBuilderConfig()
    lib.aar_gqa_pcp_builder_config_init(ctypes.byref(bc))
    assert bc.struct_size == ctypes.sizeof(PcpBuilderConfig)
    bc.max_num_reqs, bc.max_num_tokens, bc.max_blocks_per_req, bc.block_size, bc.num_blocks = 4, 32, MAXB, BS, NB
    ext = PcpBuilderExt()
    lib.aar_gqa_pcp_builder_ext_init(ctypes.byref(ext))
    assert (ext.struct_size, ext.num_speculative_tokens) == (ctypes.sizeof(PcpBuilderExt), 0)
    builder = vp(0x1)  # a sentinel: a rejected create leaves it as it was

    def refused(status, want, needle):
        msg = lib.aar_last_error().decode()
        assert status == want and needle in msg, (status, msg)

    refused(lib.aar_gqa_pcp_builder_create_ext(ctypes.byref(bc), None, ctypes.byref(builder)), 1, "ext is NULL")
    ext.num_speculative_tokens = 16
    refused(lib.aar_gqa_pcp_builder_create_ext(ctypes.byref(bc), ctypes.byref(ext), ctypes.byref(builder)), 1,
            "ext->num_speculative_tokens must be in [0, 15], got 16")
    assert builder.value == 0x1
    ext.num_speculative_tokens = 2
    _check(lib, lib.aar_gqa_pcp_builder_create_ext(ctypes.byref(bc), ctypes.byref(ext), ctypes.byref(builder)),
           "create_ext")

    def inputs(qsl, seq, pref, num_input_tokens):
        arrays = [torch.tensor(qsl, dtype=torch.int32), torch.tensor(seq, dtype=torch.int32),
                  torch.tensor([1, 2] * len(seq), dtype=torch.int32), torch.tensor(pref, dtype=torch.uint8)]
        ins = PcpBuildInputs(struct_size=ctypes.sizeof(PcpBuildInputs), query_start_loc=arrays[0].data_ptr(),
                             query_start_loc_len=len(qsl), seq_lens=arrays[1].data_ptr(), seq_lens_len=len(seq),
                             block_table=arrays[2].data_ptr(), block_table_len=2 * len(seq), block_table_stride=MAXB,
                             num_input_tokens=num_input_tokens, is_prefilling=arrays[3].data_ptr(),
                             is_prefilling_len=len(pref))
        return ins, arrays

    md = vp(0x1)
    mixed, keep_m = inputs([0, 1, 10], [8, 20], [0, 1], 12)
    refused(lib.aar_gqa_pcp_builder_build_for_graph_capture(builder, ctypes.byref(mixed), 2, ctypes.byref(md)), 2,
            "prefill")
    spec, keep_s = inputs([0, 3, 5], [8, 9], [0, 0], 8)
    refused(lib.aar_gqa_pcp_builder_build_for_graph_capture(builder, ctypes.byref(spec), -1, ctypes.byref(md)), 1,
            "state")
    assert md.value == 0x1
    _check(lib, lib.aar_gqa_pcp_builder_build_for_graph_capture(builder, ctypes.byref(spec), 4, ctypes.byref(md)),
           "build_for_graph_capture")
    count = sz(0)
    idx = (i32 * 8)(*([-7] * 8))
    _check(lib, lib.aar_gqa_pcp_builder_local_rows(builder, idx, None, sz(8), ctypes.byref(count)), "local_rows")
    assert count.value == 8 and list(idx) == [0, 1, 2, 3, 4, -1, -1, -1], list(idx)

    graph = vp()
    _check(lib, lib.aar_graph_params_create(b"recording", None, 0, ctypes.byref(graph)), "graph_params_create")
    refused(lib.aar_graph_update_gqa_pcp(graph, i64(8), None), 1, "metadata is NULL, expected an aar_gqa_pcp_metadata_t")
    refused(lib.aar_graph_update_gqa_pcp(None, i64(8), md), 1, "graph is NULL")
    refused(lib.aar_graph_update_gqa_pcp(graph, i64(8), builder), 1,
            "metadata is an aar_gqa_pcp_builder_t, expected an aar_gqa_pcp_metadata_t")
    lib.aar_graph_params_destroy(graph)
    lib.aar_gqa_pcp_builder_destroy(builder)
    del keep_m, keep_s
