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
    for op in OPS:
        assert any(f" {op} " in ln for ln in rows), op
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
