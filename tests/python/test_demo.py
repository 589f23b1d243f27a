"""The demo as a test: a short continuous-batching run per attention backend must match dense attention.
The demo is a program beside the library package (examples/demo/aar_demo), not a module of it."""

import importlib.util
import os
import pathlib
import re
import subprocess
import sys

import pytest

import ascend_attn_rt

ROOT = pathlib.Path(__file__).resolve().parents[2]
DEMO_DIR = ROOT / "examples" / "demo"
# Found from the source tree whichever package is under test (in-tree, sanitized or the installed wheel).
sys.path.insert(0, str(DEMO_DIR))

from aar_demo import demo  # noqa: E402

# The package this process imported, so a child runs the same build.
PKG_PARENT = pathlib.Path(ascend_attn_rt.__file__).resolve().parents[1]


@pytest.mark.parametrize("attention", ["gqa", "mla", "sfa", "dsa"])
def test_demo_matches_dense(attention, capsys):
    # DSA: 3 layers (SWA, C4, C128) and prompts long enough for a C128 row (position 127)
    layers, max_prompt = ("3", "140") if attention == "dsa" else ("2", "90")
    rc = demo.main(["--attention", attention, "--layers", layers, "--requests", "4", "--max-prompt", max_prompt,
                    "--max-new-tokens", "6", "--token-budget", "32", "--no-progress"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert re.search(r"greedy tokens match dense\s+yes", out), out
    if attention == "mla":
        chunks = int(out.split("MLA context chunks gathered")[1].split()[0])
        assert chunks > 0  # chunked prefills gathered cached context
    if attention == "sfa":
        m = re.search(r"top-k rows equal to reference\s+(\d+)/(\d+)", out)
        assert m and m.group(1) == m.group(2) and int(m.group(2)) > 0, out  # every indexer selection checked
        assert "top-k reused" in out  # odd layers read the shared top-k buffer
    if attention == "dsa":
        m = re.search(r"top-k rows equal to reference\s+(\d+)/(\d+)", out)
        assert m and m.group(1) == m.group(2) and int(m.group(2)) > 0, out  # every C4 selection checked
        for kind in ("SWA", "C4 (indexer top-k)", "C128"):
            assert kind in out


@pytest.mark.parametrize("argv, message", [
    (["--dsa-cp", "2"], "--dsa-cp is implemented for --attention dsa only, got --attention gqa"),
    (["--attention", "sfa", "--dsa-cp", "2"], "--dsa-cp is implemented for --attention dsa only, got --attention sfa"),
    (["--attention", "dsa", "--dsa-cp", "2", "--dcp", "2"],
     "--dcp 2 and --dsa-cp 2: the context-parallel modes are not combined"),
    (["--attention", "mla", "--dcp", "2"],
     "--dcp is implemented for --attention gqa, sfa, dsa only, got --attention mla"),
    (["--attention", "dsa", "--dcp", "4"], "--dcp 4 must divide the heads (--heads 8) and the o_proj groups (2)"),
    (["--attention", "dsa", "--dsa-cp", "4"], "--dsa-cp 4 must divide the heads (--heads 8) and the o_proj groups (2)"),
    (["--attention", "dsa", "--dsa-cp", "2", "--heads", "5"],
     "--dsa-cp 2 must divide the heads (--heads 5) and the o_proj groups (2)"),
    (["--attention", "dsa", "--dsa-cp", "0"], "--dsa-cp must be >= 1, got 0"),
])
def test_demo_context_parallel_flags_refused_by_name(argv, message):
    # Refused in the driver, before any process is spawned (the full --dsa-cp 2 run is `make demo`'s).
    with pytest.raises(SystemExit) as e:
        demo.main(argv + ["--no-progress"])
    assert message in str(e.value), str(e.value)


def _child(*args):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(PKG_PARENT), str(DEMO_DIR)]))
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, env=env, cwd=ROOT,
                          timeout=600)


def test_the_library_package_holds_no_demo():
    assert importlib.util.find_spec("ascend_attn_rt.demo") is None


def test_python_m_aar_demo_runs_the_demo():
    r = _child("aar_demo", "--layers", "1", "--requests", "2", "--max-prompt", "20", "--max-new-tokens", "2",
               "--no-progress")
    assert r.returncode == 0, r.stdout + r.stderr
    assert re.search(r"greedy tokens match dense\s+yes", r.stdout), r.stdout


def test_the_package_cli_says_where_the_demo_went():
    r = _child("ascend_attn_rt", "demo", "--attention", "mla")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "PYTHONPATH=python:examples/demo python -m aar_demo" in r.stderr, r.stderr
