#!/usr/bin/env python3
"""The layering check (run by ctest as `check_layers`): every #include of include/, cpp/ and
tools/verify_npu/ goes down the layers, never up.

Layers, bottom up (a file may include its own layer and the layers below it):

  base     errors.h: the error helpers, standard library only, which every layer throws through
  plan     include/ascend_attn_rt/plan, cpp/plan (the shared plan code) and every backend's own
           plan code (<backend>/plan/): C++17 standard library only (no torch)
  ops      include/ascend_attn_rt/ops, cpp/ops (wrappers, CPU twins, no-compute provider)
  core     include/ascend_attn_rt/core, cpp/core, cpp/common, detail/, and the top-level headers
           build_stamp.h, staging.h, attention_buffer.h, kv_connector.h
  graph    include/ascend_attn_rt/graph, cpp/graph: knows no backend
  comm     include/ascend_attn_rt/comm, cpp/comm: the collectives and the DCP exchange
  family   the modules backends share: latent (the MLA family), sparse (top-k), graph_calls (the
           captured fused-attention calls)
  backend  one module per backend: gqa, c8, fa3, mla, sfa, dsa
  cp       include/ascend_attn_rt/cp, cpp/cp: context parallel variants of the backends
  top      c_api, bindings (cpp/bindings and every backend's bindings*.cpp), and the verify-npu
           tool (verify_npu.h, tools/verify_npu)

Within the backend layer a module includes another only along FAMILY below (data, not code). A new
directory belongs to no module until it is added to MODULES: the check fails on it rather than
guessing. Known violations are listed in ALLOWED_FOR_NOW, one include per line: fixing one means
deleting its line (an entry that no longer matches an include fails the check, so the list only
shrinks).

Usage: tools/check_layers.py [--root DIR]   exit 0 clean, 1 violations (each printed), 2 usage.
"""

from __future__ import annotations

import argparse
import fnmatch
import pathlib
import re
import sys

LAYERS = ["base", "plan", "ops", "core", "graph", "comm", "family", "backend", "cp", "top"]
RANK = {name: i for i, name in enumerate(LAYERS)}

# (path pattern relative to the root, module, layer). The first match wins, so files come before
# their directories. A module is the unit the backend rule speaks of; elsewhere it names the layer.
MODULES = [
    ("include/ascend_attn_rt/errors.h", "base", "base"),
    ("cpp/*/bindings*.cpp", "bindings", "top"),
    ("cpp/*/*_bindings.cpp", "bindings", "top"),
    ("cpp/*/bindings_*.h", "bindings", "top"),
    ("include/ascend_attn_rt/plan/*", "plan", "plan"),
    ("cpp/plan/*", "plan", "plan"),
    ("include/ascend_attn_rt/*/plan/*", "plan", "plan"),
    ("cpp/*/plan/*", "plan", "plan"),
    ("include/ascend_attn_rt/ops/*", "ops", "ops"),
    ("cpp/ops/*", "ops", "ops"),
    ("include/ascend_attn_rt/core/*", "core", "core"),
    ("cpp/core/*", "core", "core"),
    ("cpp/common/*", "core", "core"),
    ("include/ascend_attn_rt/detail/*", "core", "core"),
    ("include/ascend_attn_rt/build_stamp.h", "core", "core"),
    ("include/ascend_attn_rt/staging.h", "core", "core"),
    ("include/ascend_attn_rt/attention_buffer.h", "core", "core"),
    ("include/ascend_attn_rt/kv_connector.h", "core", "core"),
    ("include/ascend_attn_rt/graph/*", "graph", "graph"),
    ("cpp/graph/*", "graph", "graph"),
    ("include/ascend_attn_rt/comm/*", "comm", "comm"),
    ("cpp/comm/*", "comm", "comm"),
    *[(f"{d}/{mod}/*", mod, "family")
      for mod in ("latent", "sparse", "graph_calls") for d in ("include/ascend_attn_rt", "cpp")],
    *[(f"{d}/{fam}/*", fam, "backend")
      for fam in ("gqa", "c8", "fa3", "mla", "sfa", "dsa") for d in ("include/ascend_attn_rt", "cpp")],
    ("include/ascend_attn_rt/cp/*", "cp", "cp"),
    ("cpp/cp/*", "cp", "cp"),
    ("include/ascend_attn_rt/c_api.h", "c_api", "top"),
    ("cpp/c_api/*", "c_api", "top"),
    ("cpp/bindings/*", "bindings", "top"),
    ("include/ascend_attn_rt/verify_npu.h", "verify_npu", "top"),
    ("tools/verify_npu/*", "verify_npu", "top"),
    ("cpp/pch_anchor.cpp", "build", "top"),  # the precompiled header's anchor for the executables
]

# Backend modules that another backend module may include: a backend built on its family's base.
FAMILY = {  # c8 and fa3 are GQA variants; the MLA and sparse families share latent/ and sparse/ instead
    "c8": {"gqa"},
    "fa3": {"gqa"},
}

# Headers a layer must not reach whatever the path: plan and base stay torch-free; only the bindings
# speak Python.
FORBIDDEN_SYSTEM = {
    "base": ("ATen/", "c10/", "torch/", "nanobind/", "Python.h", "dlpack/"),
    "plan": ("ATen/", "c10/", "torch/", "nanobind/", "Python.h", "dlpack/"),
}
PYTHON_ONLY_IN = {"bindings"}
PYTHON_HEADERS = ("nanobind/", "pybind11/", "Python.h", "torch/python.h", "torch/extension.h",
                  "torch/csrc/utils/pybind", "torch/csrc/utils/python", "torch/csrc/autograd/python")

# Today's known violations, (including file, included file), both relative to the root. Each is a
# debt of the issue-27 restructuring; the fix deletes its line.
ALLOWED_FOR_NOW: list[tuple[str, str]] = [
    # (none: the issue-27 layout removed the last ones; a new entry needs a reason on its line)
]

SCANNED = ("include", "cpp", "tools/verify_npu")
SUFFIXES = {".h", ".hpp", ".cpp", ".cc", ".inc"}
INCLUDE_RE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')


def module_of(rel: str):
    for pattern, module, layer in MODULES:
        if fnmatch.fnmatchcase(rel, pattern) or (pattern.endswith("/*") and rel.startswith(pattern[:-1])):
            return module, layer
    return None


def resolve(root: pathlib.Path, src: pathlib.Path, kind: str, name: str):
    """The repository file an include names, or None for a system / third-party header."""
    candidates = []
    if kind == '"':
        candidates.append(src.parent / name)
    if name.startswith("ascend_attn_rt/"):
        candidates.append(root / "include" / name)
    for c in candidates:
        if c.is_file():
            return c.resolve().relative_to(root.resolve()).as_posix()
    return None


def scan(root: pathlib.Path):
    """(violations, allowed_hits, stale_allowances, unclassified, unresolved) for the tree at root."""
    files = sorted(p for d in SCANNED if (root / d).is_dir() for p in (root / d).rglob("*")
                   if p.is_file() and p.suffix in SUFFIXES)
    violations, unclassified, unresolved = [], [], []
    for path in files:
        rel = path.relative_to(root).as_posix()
        here = module_of(rel)
        if here is None:
            unclassified.append(rel)
            continue
        module, layer = here
        for lineno, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            m = INCLUDE_RE.match(line)
            if not m:
                continue
            kind, name = m.groups()
            where = f"{rel}:{lineno}"
            if kind == "<" and not name.startswith("ascend_attn_rt/"):
                if name.startswith(FORBIDDEN_SYSTEM.get(layer, ())):
                    violations.append((rel, name, f"{where}: {layer} includes <{name}> (the {layer} layer is "
                                                  "C++17 standard library only)"))
                elif module not in PYTHON_ONLY_IN and name.startswith(PYTHON_HEADERS):
                    violations.append((rel, name, f"{where}: {module} includes <{name}> (only the bindings "
                                                  "speak Python)"))
                continue
            target = resolve(root, path, kind, name)
            if target is None:
                if kind == '"' or name.startswith("ascend_attn_rt/"):
                    close = '"' if kind == '"' else ">"
                    unresolved.append(f"{where}: #include {kind}{name}{close}")
                continue
            there = module_of(target)
            if there is None:
                unclassified.append(target)
                continue
            t_module, t_layer = there
            if RANK[t_layer] > RANK[layer]:
                violations.append((rel, target, f"{where}: {layer} ({module}) includes {target}, of the "
                                                f"{t_layer} layer above it"))
            elif layer == "backend" and t_layer == "backend" and t_module != module \
                    and t_module not in FAMILY.get(module, ()):
                violations.append((rel, target, f"{where}: backend {module} includes {target} of backend "
                                                f"{t_module} (not a family relation in FAMILY)"))
    allowed = set(ALLOWED_FOR_NOW)
    hits = [v for v in violations if (v[0], v[1]) in allowed]
    new = [v for v in violations if (v[0], v[1]) not in allowed]
    stale = sorted(allowed - {(v[0], v[1]) for v in violations})
    return new, hits, stale, sorted(set(unclassified)), unresolved


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", default=str(pathlib.Path(__file__).resolve().parents[1]),
                    help="repository root (default: this script's)")
    args = ap.parse_args(argv)
    root = pathlib.Path(args.root)
    if not (root / "include").is_dir():
        print(f"check_layers: --root {root} has no include/ directory", file=sys.stderr)
        return 2
    new, hits, stale, unclassified, unresolved = scan(root)
    if hits:
        print(f"check_layers: {len(hits)} known violation(s) allowed for now (ALLOWED_FOR_NOW):")
        for v in hits:
            print(f"  allowed: {v[2]}")
    failed = False
    for v in new:
        print(f"check_layers: VIOLATION {v[2]}")
        failed = True
    for a, b in stale:
        print(f"check_layers: ALLOWED_FOR_NOW entry ({a!r}, {b!r}) matches no include any more: delete its line")
        failed = True
    for rel in unclassified:
        print(f"check_layers: {rel} belongs to no layer: add its directory to MODULES in tools/check_layers.py")
        failed = True
    for u in unresolved:
        print(f"check_layers: {u} names no file of the repository")
        failed = True
    if failed:
        return 1
    print(f"check_layers: OK ({len(hits)} allowed for now)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
