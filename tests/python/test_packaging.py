"""Packaging: the wheel is built against the torch the build Python imports (any of the supported
minors) and requires, at run time, that torch's minor version (the extension links torch's C++ ABI,
which changes between minor versions). The pin comes from the in-tree dynamic-metadata provider
tools/torch_pin.py."""

import importlib.util
import json
import os
import pathlib
import re
import shutil
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


# ---------------------------------------------------------------- configuring beside any torch build
# PyPI's default torch on x86_64 is a CUDA build, and torch's own CMake package (find_package(Torch))
# then demands a CUDA toolkit. The project and its installed package must configure beside such a
# torch without one. `make install-check-cuda-torch` does it for real (a 5.5 GB venv, a full build);
# here a stand-in is configured in seconds: the running torch with its CMake package switched to
# what a CUDA build writes.

BUILD_DIR = pathlib.Path(os.environ.get("AAR_BUILD_DIR", ROOT / "build"))


def _env_without_cuda():
    """The environment with no way to a CUDA toolkit through PATH or CUDA_HOME / CUDA_PATH."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("CUDA_HOME", "CUDA_PATH", "CUDACXX", "PYTHONPATH", "LD_PRELOAD")}
    env["PATH"] = os.pathsep.join(d for d in env.get("PATH", "").split(os.pathsep)
                                  if d and not os.access(os.path.join(d, "nvcc"), os.X_OK))
    return env


def _configure(source, build, *defines):
    """cmake configure only (no build), with CMake's file API asked for the targets."""
    query = build / ".cmake" / "api" / "v1" / "query"
    query.mkdir(parents=True)
    (query / "codemodel-v2").touch()
    proc = subprocess.run(["cmake", "-S", str(source), "-B", str(build), *[f"-D{d}" for d in defines]],
                          env=_env_without_cuda(), capture_output=True, text=True, timeout=600)
    return proc, proc.stdout + proc.stderr


def _targets(build):
    """name -> the file API's target object."""
    reply = build / ".cmake" / "api" / "v1" / "reply"
    index = json.loads(next(reply.glob("index-*.json")).read_text())
    codemodel = json.loads((reply / index["reply"]["codemodel-v2"]["jsonFile"]).read_text())
    return {t["name"]: json.loads((reply / t["jsonFile"]).read_text())
            for t in codemodel["configurations"][0]["targets"]}


def _cache_entries_about_torchs_cmake_package(build):
    """CMakeCache.txt entries that only torch's CMake package (Caffe2Config, its CUDA search) makes."""
    return [line for line in (build / "CMakeCache.txt").read_text().splitlines()
            if re.match(r"(Caffe2_DIR|CUDA\w*|CUDAToolkit\w*|CAFFE2_\w*)[:=]", line)]


def _wheel_defines():
    pp = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return [f"{k}={v}" for k, v in pp["tool"]["scikit-build"]["cmake"]["define"].items()]


@pytest.fixture(scope="module")
def cuda_torch_standin(tmp_path_factory):
    """A torch prefix (include/, lib/ of the running torch) whose share/cmake is the running torch's
    with Caffe2Config.cmake switched to CUDA, as torch writes it for a CUDA build (the two builds fill
    one template; these three lines are where they differ). find_package(Torch) on it looks for a
    CUDA toolkit and, without one, fails as against PyPI's CUDA torch."""
    torch_root = pathlib.Path(torch.utils.cmake_prefix_path).parents[1]
    root = tmp_path_factory.mktemp("cuda_torch") / "torch"
    root.mkdir()
    for d in ("include", "lib"):
        (root / d).symlink_to(torch_root / d)
    shutil.copytree(torch_root / "share", root / "share")
    config = root / "share" / "cmake" / "Caffe2" / "Caffe2Config.cmake"
    text = config.read_text()
    for pattern, cuda in [(r"^if\(0\)(\n\s*# The file public/cuda\.cmake)", r"if(1)\1"),
                          (r"set\(CAFFE2_USE_CUDA 0\)", "set(CAFFE2_USE_CUDA 1)"),
                          (r"if\( AND NOT CAFFE2_USE_CUDA\)", "if(1 AND NOT CAFFE2_USE_CUDA)")]:
        text, n = re.subn(pattern, cuda, text, flags=re.M)
        assert n == 1, f"{config}: no single match of {pattern!r}; torch's Caffe2Config.cmake changed"
    config.write_text(text)
    return root


def test_project_configures_beside_a_cuda_torch_without_a_cuda_toolkit(tmp_path, cuda_torch_standin):
    build = tmp_path / "build"
    proc, log = _configure(ROOT, build, f"Python_EXECUTABLE={sys.executable}",
                           f"Torch_DIR={cuda_torch_standin}/share/cmake/Torch", *_wheel_defines())
    assert proc.returncode == 0, log[-4000:]
    assert f"Torch {torch.__version__.split('+')[0]} at {cuda_torch_standin}" in log, log[-4000:]
    assert not _cache_entries_about_torchs_cmake_package(build)


def test_installed_package_configures_beside_a_cuda_torch_without_a_cuda_toolkit(tmp_path, cuda_torch_standin):
    """An engine's find_package(ascend_attn_rt) (examples/) with a CUDA torch on CMAKE_PREFIX_PATH."""
    if not (BUILD_DIR / "cmake_install.cmake").exists():
        pytest.fail(f"no build to install at {BUILD_DIR} (set AAR_BUILD_DIR or build first)")
    prefix = tmp_path / "prefix"
    inst = subprocess.run(["cmake", "--install", str(BUILD_DIR), "--prefix", str(prefix)],
                          capture_output=True, text=True, timeout=600)
    assert inst.returncode == 0, inst.stdout + inst.stderr
    build = tmp_path / "examples"
    proc, log = _configure(ROOT / "examples", build, f"CMAKE_PREFIX_PATH={prefix};{cuda_torch_standin}/share/cmake")
    assert proc.returncode == 0, log[-4000:]
    assert not _cache_entries_about_torchs_cmake_package(build)
    # The runtime's link interface reaches the stand-in's libraries, not another torch.
    gqa = _targets(build)["embed_gqa"]
    fragments = " ".join(f["fragment"] for f in gqa["link"]["commandFragments"])
    assert f"{cuda_torch_standin}/lib/libtorch_cpu.so" in fragments, fragments


def test_wheel_build_compiles_the_package_only(tmp_path):
    """The wheel's CMake defines (pyproject.toml) leave the benchmark and test executables out; the
    runtime keeps torch_cpu's compile definitions and system include directory."""
    build = tmp_path / "build"
    proc, log = _configure(ROOT, build, f"Python_EXECUTABLE={sys.executable}", "SKBUILD=2", *_wheel_defines())
    assert proc.returncode == 0, log[-4000:]
    targets = _targets(build)
    executables = sorted(n for n, t in targets.items() if t["type"] == "EXECUTABLE")
    assert executables == [], executables
    assert {"ascend_attn_rt", "ascend_attn_rt_c", "aar_plan", "_C"} <= set(targets)
    group = targets["ascend_attn_rt"]["compileGroups"][0]
    defines = {d["define"] for d in group.get("defines", [])}
    assert {"USE_DISTRIBUTED", "USE_C10D_GLOO"} <= defines, defines
    assert _std_flags(targets["ascend_attn_rt"]) == ["-std=gnu++17"]  # what torch 2.13's headers ask for
    torch_include = str(pathlib.Path(torch.utils.cmake_prefix_path).parents[1] / "include")
    assert {"path": torch_include, "isSystem": True} in [
        {"path": i["path"], "isSystem": i.get("isSystem", False)} for i in group["includes"]], group["includes"]


def _std_flags(target):
    """The -std= flags of a target's compile groups (each source group has its own)."""
    return sorted({f["fragment"] for g in target["compileGroups"] for f in g.get("compileCommandFragments", [])
                   if f["fragment"].startswith("-std=")})


@pytest.fixture(scope="module")
def cxx20_torch_standin(tmp_path_factory):
    """A torch prefix like the running torch's but whose <ATen/ATen.h> demands C++20, as torch's
    does from 2.14 on (the running torch is 2.13, whose headers ask for C++17)."""
    torch_root = pathlib.Path(torch.utils.cmake_prefix_path).parents[1]
    root = tmp_path_factory.mktemp("cxx20_torch") / "torch"
    (root / "include" / "ATen").mkdir(parents=True)
    for entry in (torch_root / "include").iterdir():
        if entry.name != "ATen":
            (root / "include" / entry.name).symlink_to(entry)
    for entry in (torch_root / "include" / "ATen").iterdir():
        if entry.name != "ATen.h":
            (root / "include" / "ATen" / entry.name).symlink_to(entry)
    header = (torch_root / "include" / "ATen" / "ATen.h").read_text()
    header, n = re.subn(r"__cplusplus < 201703L", "__cplusplus < 202002L", header)
    assert n == 1, "torch's <ATen/ATen.h> has no single C++17 guard"
    (root / "include" / "ATen" / "ATen.h").write_text(header)
    (root / "lib").symlink_to(torch_root / "lib")
    (root / "share").symlink_to(torch_root / "share")
    return root


def test_targets_using_torch_compile_with_the_standard_torchs_headers_demand(tmp_path, cxx20_torch_standin):
    """torch 2.14's headers stop at a compiler below C++20: the runtime, _C and an engine linking
    them are compiled as C++20 then, the torch-free plan layer stays C++17."""
    build = tmp_path / "build"
    proc, log = _configure(ROOT, build, f"Python_EXECUTABLE={sys.executable}",
                           f"Torch_DIR={cxx20_torch_standin}/share/cmake/Torch", *_wheel_defines())
    assert proc.returncode == 0, log[-4000:]
    targets = _targets(build)
    for name in ("ascend_attn_rt", "ascend_attn_rt_c", "_C"):
        assert _std_flags(targets[name]) == ["-std=gnu++20"], (name, _std_flags(targets[name]))
    assert _std_flags(targets["aar_plan"]) == ["-std=gnu++17"]
