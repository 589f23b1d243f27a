"""Packaging: the wheel is built against the torch the build Python imports (any of the supported
minors) and requires, at run time, that torch's minor version (the extension links torch's C++ ABI,
which changes between minor versions). The pin comes from the in-tree dynamic-metadata provider
tools/torch_pin.py."""

import importlib.util
import os
import pathlib
import re
import subprocess
import sys

import pytest
import torch

ROOT = pathlib.Path(__file__).resolve().parents[2]

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - the test venv is 3.11
    tomllib = pytest.importorskip("tomli")


def _provider():
    spec = importlib.util.spec_from_file_location("torch_pin", ROOT / "tools" / "torch_pin.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _running_minor():
    major, minor = re.match(r"(\d+)\.(\d+)", torch.__version__).groups()
    return f"{major}.{minor}"


def test_provider_pins_the_running_torch_minor():
    assert _provider().dynamic_metadata({}, {}) == {"dependencies": [f"torch=={_running_minor()}.*"]}


@pytest.mark.parametrize("version,pin", [
    ("2.13.0", "torch==2.13.*"),
    ("2.14.0+cpu", "torch==2.14.*"),
    ("2.15.1", "torch==2.15.*"),
    ("2.16.0.dev20260101+cpu", "torch==2.16.*"),
    ("2.14.0a0+git1234abc", "torch==2.14.*"),
    ("10.2.3", "torch==10.2.*"),
])
def test_pin_of_a_version_string(version, pin):
    assert _provider().torch_pin(version) == pin


@pytest.mark.parametrize("version", ["", "2", "two.13", "2.x.0"])
def test_pin_rejects_a_malformed_version_naming_it(version):
    with pytest.raises(ValueError, match=re.escape(repr(version))):
        _provider().torch_pin(version)


def test_provider_takes_no_settings():
    with pytest.raises(ValueError, match="unknown"):
        _provider().dynamic_metadata({"unknown": 1}, {})


def test_pyproject_builds_against_a_range_and_pins_dynamically():
    pp = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "torch>=2.13,<2.16" in pp["build-system"]["requires"]
    assert "dependencies" in pp["project"]["dynamic"] and "dependencies" not in pp["project"]
    entries = pp["tool"]["dynamic-metadata"]
    assert {"path": "tools", "module": "torch_pin"} in [e["provider"] for e in entries]


def test_wheel_metadata_requires_the_build_torch_minor(tmp_path):
    """What pip reads before it installs: scikit-build-core's PEP 517 metadata hook, run as pip runs it."""
    pytest.importorskip("scikit_build_core")
    code = ("import sys; from scikit_build_core import build; "
            "print(build.prepare_metadata_for_build_wheel(sys.argv[1]))")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    dist_info = tmp_path / proc.stdout.strip().splitlines()[-1]
    requires = [line for line in (dist_info / "METADATA").read_text().splitlines() if line.startswith("Requires-Dist:")]
    assert f"Requires-Dist: torch=={_running_minor()}.*" in requires, requires
    assert not [r for r in requires if re.match(r"Requires-Dist: torch\b", r) and "extra ==" not in r
                and r != f"Requires-Dist: torch=={_running_minor()}.*"], requires
