"""tools/check_layers.py, the layering check that ctest runs (`check_layers`): on small trees made here it
fails on every kind of include that goes up the layers and passes on those that go down; on the repository
it passes with its ALLOWED_FOR_NOW list, each entry of which still matches an include."""

import importlib.util
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tools" / "check_layers.py"


def _load():
    spec = importlib.util.spec_from_file_location("check_layers", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


CL = _load()


def make_tree(tmp_path, files):
    """files: {relative path: text}; every tree gets an include/ directory."""
    (tmp_path / "include").mkdir(exist_ok=True)
    for rel, text in files.items():
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return tmp_path


@pytest.fixture
def run(monkeypatch, capsys):
    """check_layers on a tree made here, with no allowances (the repository's name files these trees lack)."""
    monkeypatch.setattr(CL, "ALLOWED_FOR_NOW", [])

    def go(root):
        rc = CL.main(["--root", str(root)])
        out = capsys.readouterr()
        return subprocess.CompletedProcess([], rc, out.out, out.err)

    return go


H = "include/ascend_attn_rt"
BASE = {
    f"{H}/errors.h": "#include <string>\n",
    f"{H}/plan/span.h": "#include <cstddef>\n",
    f"{H}/ops/provider.h": '#include "ascend_attn_rt/errors.h"\n',
    f"{H}/graph/provider.h": '#include "ascend_attn_rt/ops/provider.h"\n',
    f"{H}/gqa/metadata.h": '#include "ascend_attn_rt/plan/span.h"\n',
    f"{H}/mla/metadata.h": '#include "ascend_attn_rt/plan/span.h"\n',
    f"{H}/comm/comm.h": '#include "ascend_attn_rt/graph/provider.h"\n',
    f"{H}/latent/weights.h": '#include "ascend_attn_rt/comm/comm.h"\n',
    f"{H}/cp/gqa_dcp.h": '#include "ascend_attn_rt/gqa/metadata.h"\n',
    "cpp/common/staging.h": "#pragma once\n",
    "cpp/ops/op_handle.h": '#include <ATen/core/Tensor.h>\n#include "ascend_attn_rt/ops/provider.h"\n',
}


def test_a_tree_whose_includes_go_down_passes(tmp_path, run):
    r = run(make_tree(tmp_path, dict(BASE, **{
        "cpp/c8/impl.cpp": '#include "ascend_attn_rt/gqa/metadata.h"\n',   # a family relation
        "cpp/mla/impl.cpp": '#include "ascend_attn_rt/latent/weights.h"\n',  # a family module
        "cpp/gqa/plan/p.cpp": '#include "ascend_attn_rt/plan/span.h"\n',     # a backend's plan code
        "cpp/gqa/bindings.cpp": '#include <nanobind/nanobind.h>\n',         # a backend's bindings
        "cpp/bindings/m.cpp": "#include <nanobind/nanobind.h>\n#include \"ascend_attn_rt/comm/comm.h\"\n",
        "cpp/ops/cpu/twin.cpp": '#include "../op_handle.h"\n',               # relative to the file
    })))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "OK" in r.stdout


@pytest.mark.parametrize("rel,text,why", [
    ("cpp/plan/x.cpp", '#include "ascend_attn_rt/ops/provider.h"\n', "plan (plan) includes include/ascend_attn_rt/ops"),
    ("cpp/plan/y.cpp", "#include <ATen/ATen.h>\n", "plan includes <ATen/ATen.h>"),
    (f"{H}/errors.h", "#include <c10/util/Exception.h>\n", "base includes <c10/util/Exception.h>"),
    ("cpp/ops/z.cpp", '#include "../common/staging.h"\n', "ops (ops) includes cpp/common/staging.h, of the core"),
    (f"{H}/graph/p.h", '#include "ascend_attn_rt/gqa/metadata.h"\n', "graph (graph) includes"),
    ("cpp/common/k.cpp", '#include "ascend_attn_rt/graph/provider.h"\n', "core (core) includes"),
    ("cpp/gqa/d.cpp", '#include "ascend_attn_rt/cp/gqa_dcp.h"\n', "backend (gqa) includes include/ascend_attn_rt/cp"),
    ("cpp/comm/d.cpp", '#include "ascend_attn_rt/latent/weights.h"\n', "comm (comm) includes"),
    ("cpp/latent/d.cpp", '#include "ascend_attn_rt/mla/metadata.h"\n', "family (latent) includes"),
    ("cpp/gqa/plan/q.cpp", '#include "ascend_attn_rt/ops/provider.h"\n', "plan (plan) includes"),
    ("cpp/gqa/plan/r.cpp", "#include <ATen/ATen.h>\n", "plan includes <ATen/ATen.h>"),
    ("cpp/gqa/e.cpp", '#include "ascend_attn_rt/mla/metadata.h"\n', "backend gqa includes"),
    ("cpp/mla/f.cpp", '#include "ascend_attn_rt/gqa/metadata.h"\n', "backend mla includes"),
    ("cpp/gqa/g.cpp", "#include <nanobind/nanobind.h>\n", "only the bindings speak Python"),
])
def test_an_include_up_the_layers_fails_naming_it(tmp_path, run, rel, text, why):
    r = run(make_tree(tmp_path, dict(BASE, **{rel: text})))
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"VIOLATION {rel}:1: " in r.stdout and why in r.stdout, r.stdout


def test_a_file_of_no_layer_fails(tmp_path, run):
    r = run(make_tree(tmp_path, dict(BASE, **{"cpp/newdir/a.cpp": "int a;\n"})))
    assert r.returncode == 1 and "cpp/newdir/a.cpp belongs to no layer" in r.stdout, r.stdout


def test_an_include_of_a_missing_project_header_fails(tmp_path, run):
    r = run(make_tree(tmp_path, dict(BASE, **{"cpp/gqa/a.cpp": '#include "ascend_attn_rt/gqa/gone.h"\n'})))
    assert r.returncode == 1 and "names no file of the repository" in r.stdout, r.stdout


def test_allowed_for_now_entries_pass_and_a_stale_one_fails(tmp_path, monkeypatch):
    root = make_tree(tmp_path, dict(BASE, **{f"{H}/graph/p.h": '#include "ascend_attn_rt/gqa/metadata.h"\n'}))
    pair = (f"{H}/graph/p.h", f"{H}/gqa/metadata.h")
    monkeypatch.setattr(CL, "ALLOWED_FOR_NOW", [pair])
    new, hits, stale, unclassified, unresolved = CL.scan(root)
    assert not new and [h[:2] for h in hits] == [pair] and not stale and not unclassified and not unresolved
    (root / pair[0]).write_text("#pragma once\n")  # fixed: the entry must go
    new, hits, stale, _, _ = CL.scan(root)
    assert not new and not hits and stale == [pair]


def test_the_repository_passes_and_every_allowance_is_live():
    # As ctest runs it: the script on its own repository, exit 0.
    r = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    new, hits, stale, unclassified, unresolved = CL.scan(ROOT)
    assert not new and not stale and not unclassified and not unresolved
    assert len(hits) == len(CL.ALLOWED_FOR_NOW)
