"""Documented commands work as typed: `.venv/bin/python -m pytest` from the repository root, without
PYTHONPATH (pyproject's pytest `pythonpath` puts `python/` and `tests/python/` on the path), and the
`make demo` lines the README quotes."""

import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.skipif(os.environ.get("AAR_SANITIZED") == "1",
                    reason="checks the normal build's in-tree package (python/, from `make build`), which `make "
                           "test-sanitize` neither builds nor instruments; `make test` runs it")
def test_pytest_from_the_repository_root_without_pythonpath():
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    # A test module that imports the package and the test helpers (_mla_reference) at collection.
    cmd = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
           "tests/python/test_mla_decode_workspace.py"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{' '.join(cmd)} (cwd {ROOT}, no PYTHONPATH) failed:\n{proc.stdout}\n{proc.stderr}"
    assert "test_layers_share_the_decode_workspace" in proc.stdout


def _make_demo_recipe():
    """The command lines of the Makefile's `demo` target, with $(PY) as this interpreter."""
    lines, inside = [], False
    for ln in (ROOT / "Makefile").read_text().splitlines():
        if ln.startswith("demo:"):
            inside = True
        elif inside and ln.startswith("\t"):
            lines.append(ln.strip().replace("$(PY)", sys.executable))
        elif inside:
            break
    return lines


@pytest.mark.skipif(os.environ.get("AAR_SANITIZED") == "1",
                    reason="the recipe imports the normal build's in-tree package (python/), which `make "
                           "test-sanitize` neither builds nor instruments; `make test` runs it")
def test_make_demo_commands_start_the_demo():
    # The lines as typed (their PYTHONPATH and module, the same for all seven), stopped at the argument parser by
    # --help: the full runs are test_demo.py's; this checks that what `make demo` and the README run is the demo.
    recipe = _make_demo_recipe()
    starts = {cmd.split(" -m aar_demo")[0] + " -m aar_demo" for cmd in recipe}
    assert len(recipe) == 7 and all("-m aar_demo" in cmd for cmd in recipe) and len(starts) == 1, recipe
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    cmd = starts.pop() + " --help"
    proc = subprocess.run(cmd, shell=True, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{cmd} failed:\n{proc.stdout}\n{proc.stderr}"
    assert "usage: python -m aar_demo" in proc.stdout, proc.stdout
    # Every flag a recipe line passes is one the demo's parser knows (the context-parallel runs' flags included).
    for flag in {a for line in recipe for a in line.split() if a.startswith("--")}:
        assert flag in proc.stdout, (flag, proc.stdout)
    readme = (ROOT / "README.md").read_text()
    assert "`make demo` runs `PYTHONPATH=python:examples/demo .venv/bin/python -m aar_demo" in readme
    # The README's demo paragraph names each multi-process run as `aar_demo <its arguments>`.
    for cmd in recipe:
        run_args = cmd.split(" -m aar_demo")[1].strip()
        if "--dcp" in run_args or "--dsa-cp" in run_args:
            assert f"`aar_demo {run_args}`" in readme, run_args
