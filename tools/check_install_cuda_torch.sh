#!/usr/bin/env bash
# make install-check-cuda-torch: the package installed as a user beside PyPI's torch installs it,
# on a machine with no CUDA toolkit.
#  1. a fresh venv ($WORK/venv) with PyPI's default torch of the supported range (TORCH_SPEC; on
#     x86_64 that is a CUDA build, several GB), scikit-build-core, nanobind, cmake, ninja, numpy;
#  2. a clean copy of the tree ($WORK/src: git archive of HEAD with the tracked files' uncommitted
#     changes, never the dev tree and its build directories);
#  3. CUDA made unfindable: nvcc's directories dropped from PATH, CUDA_HOME / CUDA_PATH unset and,
#     where `unshare -m` is allowed (root), the toolkit's directories covered by empty mounts in a
#     private mount namespace (nothing outside this script sees them);
#  4. `pip install --no-build-isolation $WORK/src`;
#  5. from a directory outside both trees: the package imported from the venv and one GQA decode
#     forward checked against a float64 reference (tools/install_check_forward.py);
#  6. the installed CMake package: examples/ configured and built as an engine would, against
#     site-packages/ascend_attn_rt and torch.utils.cmake_prefix_path, and embed_gqa run.
# Takes the cold build of the runtime (tens of minutes on 2 cores; ccache keeps a rerun short).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=${WORK:-/tmp/aar-install-check}
TORCH_SPEC=${TORCH_SPEC:-torch>=2.13,<2.16}
JOBS=${JOBS:-2}
PYTHON=${PYTHON:-python3}
export AAR_INSTALL_CHECK_T0=${AAR_INSTALL_CHECK_T0:-$(date +%s)}
phase() { echo "install-check: [$(($(date +%s) - AAR_INSTALL_CHECK_T0)) s] $*"; }

if [[ ${AAR_INSTALL_CHECK_INNER:-} != 1 ]]; then
  rm -rf "$WORK" && mkdir -p "$WORK/src" "$WORK/outside"
  phase "venv $WORK/venv with '$TORCH_SPEC'"
  "$PYTHON" -m venv "$WORK/venv"
  "$WORK/venv/bin/python" -m pip install -q --upgrade pip
  "$WORK/venv/bin/python" -m pip install -q "$TORCH_SPEC" "scikit-build-core>=1.1" "nanobind>=2.0" cmake ninja numpy
  phase "venv ready: $(du -sh "$WORK/venv" | cut -f1)"
  rev=$(git -C "$ROOT" stash create)
  rev=${rev:-HEAD}
  git -C "$ROOT" archive --format=tar "$rev" | tar -x -C "$WORK/src"
  phase "source: $(git -C "$ROOT" rev-parse --short HEAD)$([[ $rev == HEAD ]] || echo ' + uncommitted changes')"

  # Every directory that could give CMake or torch a CUDA toolkit.
  hide=()
  for d in "${CUDA_HOME:-}" "${CUDA_PATH:-}" /usr/local/cuda /usr/local/cuda-* /opt/cuda; do
    [[ -n $d && -d $d ]] && hide+=("$(realpath "$d")")
  done
  keep_path=()
  IFS=: read -ra path_dirs <<< "$PATH"
  for d in "${path_dirs[@]}"; do
    if [[ -x $d/nvcc ]]; then hide+=("$(realpath "$d")"); else keep_path+=("$d"); fi
  done
  clean_path=$(IFS=:; echo "${keep_path[*]}")
  export AAR_INSTALL_CHECK_INNER=1 WORK JOBS
  AAR_INSTALL_CHECK_HIDE=$(printf '%s\n' "${hide[@]}" | sort -u | paste -sd ' ')
  export AAR_INSTALL_CHECK_HIDE
  if unshare -m true 2>/dev/null; then
    exec env -u CUDA_HOME -u CUDA_PATH PATH="$clean_path" unshare -m "$0"
  fi
  echo "install-check: unshare -m is not allowed here: CUDA is only dropped from PATH and the environment"
  exec env -u CUDA_HOME -u CUDA_PATH AAR_INSTALL_CHECK_HIDE= PATH="$clean_path" "$0"
fi

for d in ${AAR_INSTALL_CHECK_HIDE:-}; do
  mount -t tmpfs -o size=1m,mode=0755 none "$d"
done
if command -v nvcc >/dev/null || [[ -e /usr/local/cuda/bin/nvcc ]]; then
  echo "install-check: nvcc is still findable ($(command -v nvcc || echo /usr/local/cuda/bin/nvcc))" >&2
  exit 1
fi
phase "no CUDA toolkit findable (hidden: ${AAR_INSTALL_CHECK_HIDE:-none}; CUDA_HOME unset)"

VPY=$WORK/venv/bin/python
export PATH="$WORK/venv/bin:$PATH" CMAKE_BUILD_PARALLEL_LEVEL=$JOBS CCACHE_BASEDIR=$WORK
phase "pip install --no-build-isolation (log: $WORK/pip.log)"
if ! "$VPY" -m pip install -v --no-build-isolation "$WORK/src" > "$WORK/pip.log" 2>&1; then
  grep -v "is ignored: it is neither" "$WORK/pip.log" | tail -40
  echo "install-check: FAILED: pip install --no-build-isolation" >&2
  exit 1
fi
phase "installed: $("$VPY" -m pip list 2>/dev/null | grep -iE '^(torch|ascend.attn.rt) ' | tr -s ' ' | paste -sd ';')"

SITE=$("$VPY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
(cd "$WORK/outside" && "$VPY" "$WORK/src/tools/install_check_forward.py" "$SITE")
phase "forward checked"

TP=$("$VPY" -c 'import torch; print(torch.utils.cmake_prefix_path)')
cmake -DMODE=build -DSOURCE_DIR="$WORK/src/examples" -DBINARY_DIR="$WORK/examples" -DGENERATOR=Ninja \
  -DCXX_COMPILER="$(command -v g++)" -DPREFIX="$SITE/ascend_attn_rt" -DTORCH_PREFIX="$TP" \
  -P "$WORK/src/cmake/package_test.cmake" > "$WORK/examples.log" 2>&1 \
  || { tail -40 "$WORK/examples.log"; echo "install-check: FAILED: examples/ against the installed package" >&2; exit 1; }
"$WORK/examples/embed_gqa" | tail -1
phase "examples/ built against the installed CMake package and embed_gqa run"
echo "install-check: OK ($WORK)"
