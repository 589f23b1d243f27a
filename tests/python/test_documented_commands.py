"""The documented test command works as typed: `.venv/bin/python -m pytest` from the repository root,
without PYTHONPATH (pyproject's pytest `pythonpath` puts `python/` and `tests/python/` on the path)."""

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
