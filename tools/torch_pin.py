"""Dynamic-metadata provider (scikit-build-core, ``[[tool.dynamic-metadata]]`` in pyproject.toml):
the wheel's run-time torch requirement.

The extension is compiled against one torch, the one the build Python imports (CMakeLists.txt asks
that same interpreter for torch's CMake prefix), and links torch's C++ ABI, which changes between
minor versions. So the wheel requires ``torch==X.Y.*`` for the X.Y it was built with, whatever
minor of the supported build range (build-system.requires) that was.

The version is read by running the build Python in a subprocess, exactly as CMake does, so the pin
and the compiled code come from the same torch, and the build backend's process never loads torch.
"""

import re
import subprocess
import sys

__all__ = ["torch_pin", "build_torch_version", "dynamic_metadata", "dynamic_wheel"]

_MAJOR_MINOR = re.compile(r"(\d+)\.(\d+)(?![\d])(?:[.+a-zA-Z]|$)")


def torch_pin(version):
    """``torch==X.Y.*`` for a torch version string such as ``2.14.0+cpu`` or ``2.16.0.dev20260101``."""
    m = _MAJOR_MINOR.match(version.strip()) if isinstance(version, str) else None
    if m is None:
        raise ValueError(f"torch version {version!r} does not start with MAJOR.MINOR")
    return f"torch=={m.group(1)}.{m.group(2)}.*"


def build_torch_version(python=None):
    """torch.__version__ as the build Python (``sys.executable`` unless given) imports it."""
    python = python or sys.executable
    code = "import torch; print(torch.__version__)"
    proc = subprocess.run([python, "-c", code], capture_output=True, text=True)
    if proc.returncode != 0 or not proc.stdout.strip():
        raise RuntimeError(
            f"torch is not importable by the build Python {python} (it is a build requirement, "
            f"torch>=2.13,<2.16):\n{proc.stderr[-2000:]}")
    return proc.stdout.strip().splitlines()[-1]


def dynamic_metadata(settings, project):
    if settings:
        raise ValueError(f"the torch_pin provider takes no settings, got {sorted(settings)}")
    return {"dependencies": [torch_pin(build_torch_version())]}


def dynamic_wheel(settings):
    # The pin depends on the torch of the build environment: an SDist marks Requires-Dist as
    # Dynamic (METADATA 2.2), since a wheel built from it may require another minor.
    return {"dependencies": True}
