"""verify-npu (issue 14 part 5) without an NPU: it refuses (exit 2) unless a stand-in is given; with the CPU
twin standing in every row passes (exit 0); with a deliberately perturbed stand-in the perturbed operator's
rows fail (exit 1) and the report names the operator and its arguments. Both front ends, the Python CLI and
the C++ executable build/aar_verify_npu, run the one table (verify_npu.h)."""

import os
import pathlib
import subprocess
import sys

import pytest

import ascend_attn_rt

ROOT = pathlib.Path(__file__).resolve().parents[2]
# The build under test: build/ by default; `make test-sanitize` points AAR_BUILD_DIR at build-asan/, whose
# package (the one this process imported) the Python front end's child must import too.
BUILD_DIR = pathlib.Path(os.environ.get("AAR_BUILD_DIR", ROOT / "build"))
EXE = BUILD_DIR / "aar_verify_npu"
PKG_PARENT = pathlib.Path(ascend_attn_rt.__file__).resolve().parents[1]


def py(*args):
    env = dict(os.environ, PYTHONPATH=str(PKG_PARENT))
    return subprocess.run([sys.executable, "-m", "ascend_attn_rt", "verify-npu", *args], capture_output=True,
                          text=True, env=env, timeout=600)


def cpp(*args):
    assert EXE.exists(), f"{EXE} is built by `make build` (`make build-asan` for {BUILD_DIR})"
    return subprocess.run([str(EXE), *args], capture_output=True, text=True, timeout=600)


FRONT_ENDS = [pytest.param(py, id="python"), pytest.param(cpp, id="cpp")]
OPS = ["npu_fused_infer_attention_score", "npu_fused_infer_attention_score_v2", "npu_attention_update",
       "_npu_reshape_and_cache", "npu_scatter_pa_kv_cache"]
# The MLA family, SFA, DSA, the quantisation operators and the other GQA paths (issue 14 part 5).
NEW_OPS = ["mla_preprocess", "npu_mla_prolog_v3", "npu_mla_prolog_v2", "npu_kv_rmsnorm_rope_cache",
           "npu_interleave_rope", "npu_transpose_batchmatmul", "batch_matmul_transpose", "npu_gather_pa_kv_cache",
           "npu_sparse_flash_attention", "npu_lightning_indexer", "npu_lightning_indexer_quant",
           "npu_quant_lightning_indexer", "npu_kv_quant_sparse_flash_attention", "npu_dynamic_block_quant",
           "npu_rotary_mul", "npu_scatter_nd_update_", "hadamard_rotate", "compressor", "compressor_metadata",
           "compressor_metadata_out",
           "npu_sparse_attn_sharedkv", "npu_sparse_attn_sharedkv_metadata", "npu_kv_quant_sparse_attn_sharedkv",
           "npu_kv_quant_sparse_attn_sharedkv_metadata", "sparse_flash_mla", "sparse_flash_mla_metadata",
           "npu_vllm_quant_lightning_indexer", "npu_vllm_quant_lightning_indexer_metadata", "kv_compress_epilog",
           "indexer_compress_epilog_v2", "npu_scatter_nd_update_v2", "inplace_partial_rotary_mul",
           "npu_dynamic_quant", "npu_rms_norm_dynamic_quant", "npu_quantize", "npu_quant_matmul", "npu_dynamic_mx_quant", "npu_transpose_quant_batchmatmul",
           "_npu_paged_attention", "npu_fusion_attention"]
# A representative set of the new rows: a perturbed stand-in fails exactly that operator's rows.
PERTURBED = ["mla_preprocess", "npu_mla_prolog_v3", "npu_kv_rmsnorm_rope_cache", "npu_sparse_flash_attention",
             "npu_lightning_indexer", "compressor", "npu_sparse_attn_sharedkv_metadata", "kv_compress_epilog",
             "npu_scatter_nd_update_v2", "npu_dynamic_mx_quant", "npu_transpose_quant_batchmatmul",
             "npu_dynamic_quant", "npu_quantize"]


def table_rows(stdout):
    """(status, op, line) of each row line."""
    out = []
    for ln in stdout.splitlines():
        if ln.startswith(("PASS", "FAIL")):
            out.append((ln[:4], ln.split()[1], ln))
    return out


@pytest.mark.parametrize("run", FRONT_ENDS)
def test_refuses_without_an_npu(run):
    r = run()
    assert r.returncode == 2
    assert "no NPU here" in r.stderr and "--stand-in twin" in r.stderr


@pytest.mark.parametrize("run", FRONT_ENDS)
def test_twin_standing_in_passes_every_row(run):
    r = run("--stand-in", "twin")
    assert r.returncode == 0, r.stdout + r.stderr
    rows = [ln for ln in r.stdout.splitlines() if ln.startswith(("PASS", "FAIL"))]
    assert len(rows) >= 10 and all(ln.startswith("PASS") for ln in rows)
    ops = {op for _, op, _ in table_rows(r.stdout)}
    for op in OPS + NEW_OPS:
        assert op in ops, op
    assert len(rows) >= 10 + 67
    # the .out overloads the backends call eagerly have rows of their own
    assert sum(", through .out" in ln for ln in rows) >= 6
    # the open assumptions are named
    for needle in ("pre_tokens convention", "antiquant offset sign", "sinks enter the softmax"):
        assert needle in r.stdout
    assert f"{len(rows)}/{len(rows)} rows passed" in r.stdout


@pytest.mark.parametrize("run", FRONT_ENDS)
def test_perturbed_stand_in_fails_and_names_operator_and_arguments(run):
    r = run("--stand-in", "perturbed:npu_attention_update")
    assert r.returncode == 1, r.stdout + r.stderr
    fails = [ln for ln in r.stdout.splitlines() if ln.startswith("FAIL")]
    assert len(fails) == 2 and all(" npu_attention_update " in ln for ln in fails)
    assert "FAILED: npu_attention_update [3 partials, M=40, D=64 fp32, update_type=0" in r.stdout
    assert "update_type=1" in fails[1]
    passes = [ln for ln in r.stdout.splitlines() if ln.startswith("PASS")]
    assert passes and not any("npu_attention_update" in ln for ln in passes)


@pytest.mark.parametrize("run", FRONT_ENDS)
def test_perturbed_fia_rows_fail(run):
    r = run("--stand-in", "perturbed:npu_fused_infer_attention_score", "--only", "sliding")
    assert r.returncode == 1
    assert "FAIL  npu_fused_infer_attention_score" in r.stdout and "pre_tokens=7" in r.stdout


@pytest.mark.parametrize("run", FRONT_ENDS)
def test_bad_options_refused(run):
    r = run("--stand-in", "perturbed:no_such_op")
    assert r.returncode == 2 and "no row calls operator 'no_such_op'" in r.stderr
    r = run("--stand-in", "bogus")
    assert r.returncode == 2 and "'twin' or 'perturbed:OPNAME'" in r.stderr


def test_list_names_every_row():
    r = py("--list")
    assert r.returncode == 0 and r.stdout.count("settles:") >= 10


def inproc(*args):
    """The CLI's table run in this process (the front ends are tested above; this saves a torch import per run)."""
    from ascend_attn_rt import _C

    rc, text = _C.verify_npu_cli(list(args))
    return subprocess.CompletedProcess(args, rc, text, "")


@pytest.mark.parametrize("op", PERTURBED)
def test_perturbed_new_rows_fail_and_name_operator_and_arguments(op):
    # --only keeps the run short; rows of other operators whose name contains op still run (and pass).
    r = inproc("--stand-in", f"perturbed:{op}", "--only", op)
    assert r.returncode == 1, r.stdout + r.stderr
    rows = table_rows(r.stdout)
    mine = [(st, ln) for st, o, ln in rows if o == op]
    assert mine and all(st == "FAIL" for st, _ in mine), r.stdout
    assert all(st == "PASS" for st, o, _ in rows if o != op), r.stdout
    summary = r.stdout.strip().splitlines()[-1]
    assert f"FAILED: {op} [" in summary
    for _, ln in mine:  # the report names the operator and its arguments
        args = ln.split("  ")[-1].strip()
        assert f"{op} [{args}]" in summary


def test_perturbed_new_row_fails_in_the_cpp_front_end():
    r = cpp("--stand-in", "perturbed:npu_sparse_attn_sharedkv", "--only", "sharedkv")
    assert r.returncode == 1, r.stdout + r.stderr
    rows = table_rows(r.stdout)
    fails = [ln for st, o, ln in rows if st == "FAIL"]
    assert len(fails) == 3 and all(" npu_sparse_attn_sharedkv " in ln for ln in fails)
    assert any("C4 (cmp_ratio=4" in ln for ln in fails)
    # the metadata and kv-quant rows (other operators) still pass
    assert any(st == "PASS" and o == "npu_sparse_attn_sharedkv_metadata" for st, o, _ in rows)

