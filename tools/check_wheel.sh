#!/usr/bin/env bash
# Builds the wheel and checks it the way its users take it (make wheel-check):
#  1. `pip wheel --no-build-isolation` against the venv's torch;
#  2. the wheel installed into a scratch site-packages (--target) with the venv's torch
#     beside it, as in a real environment (the libraries' RUNPATH is $ORIGIN/../torch/lib);
#  3. Python: the package imports from there (not python/) and a set of the pytest
#     suites runs against it (the MLA attention-only entry, the vLLM adapter, GQA
#     forward, the demo);
#  4. C++ and C: examples/, examples/plan_only and examples/c configured and built as
#     separate CMake projects against the wheel's tree (site-packages/ascend_attn_rt is
#     the CMake prefix), then run.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PY:-$ROOT/.venv/bin/python}
WORK=${WORK:-$(mktemp -d /tmp/aar-wheel.XXXXXX)}
SITE=$WORK/site
cd "$ROOT"
"$PY" -m pip wheel . --no-build-isolation --no-deps -w "$WORK/dist" -q
"$PY" -m pip install -q --no-deps --target "$SITE" "$WORK"/dist/ascend_attn_rt-*.whl
ln -sfn "$("$PY" -c 'import os, torch; print(os.path.dirname(torch.__file__))')" "$SITE/torch"
where=$(cd "$WORK" && PYTHONPATH=$SITE "$PY" -c 'import ascend_attn_rt; print(ascend_attn_rt.__file__)')
[[ $where == "$SITE"/* ]] || { echo "check_wheel: imported $where, not the wheel's package" >&2; exit 1; }
(cd "$WORK" && PYTHONPATH=$SITE:$ROOT/tests/python "$PY" -m pytest -q -c /dev/null --rootdir "$WORK" \
  -p no:cacheprovider "$ROOT"/tests/python/test_mla_latent_attention.py "$ROOT"/tests/python/test_vllm_backend.py \
  "$ROOT"/tests/python/test_gqa_forward.py "$ROOT"/tests/python/test_demo.py)
TP=$("$PY" -c 'import torch; print(torch.utils.cmake_prefix_path)')
for spec in "examples|examples|-DTORCH_PREFIX=$TP|embed_gqa embed_mla" "plan_only|examples/plan_only|-DNO_TORCH=ON|plan_only" \
            "c|examples/c|-DNO_TORCH=ON|c_attention"; do
  IFS='|' read -r name src extra exes <<< "$spec"
  cmake -DMODE=build -DSOURCE_DIR="$ROOT/$src" -DBINARY_DIR="$WORK/cmake/$name" -DGENERATOR=Ninja \
    -DCXX_COMPILER="$(command -v g++)" -DPREFIX="$SITE/ascend_attn_rt" "$extra" -P cmake/package_test.cmake
  for exe in $exes; do "$WORK/cmake/$name/$exe" | tail -1; done
done
echo "check_wheel: OK ($WORK)"
