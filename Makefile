# Two commands do all the set-up on a fresh machine:
#   make test   builds everything and runs every C++ and Python test
#   make demo   builds and runs the continuous-batching demo (examples/demo)
# Both create .venv, install torch 2.13.0 (CPU) and the Python dependencies, and
# install libgtest-dev through apt when it is missing.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
BUILD  := build
JOBS   ?= $(shell nproc)
SUDO   := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: all setup venv vllm gtest build test test-cpp test-python demo bench clean \
	build-asan test-sanitize build-tsan test-tsan clang build-fuzz fuzz fuzz-smoke wheel-check \
	install-check-cuda-torch

all: build

setup: venv gtest

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "torch==2.13.0" "nanobind>=2.0" "scikit-build-core>=1.1" \
		"pytest>=7" numpy ninja tqdm
	touch $@

# vLLM 0.27.1 for the attention-backend adapter's tests (tests/python/test_vllm_backend.py):
# built once from its sdist with VLLM_TARGET_DEVICE=empty (pure Python) in a side venv that
# sees .venv's torch through a .pth file (its build pins setuptools<81, which stays out of
# .venv), the wheel cached in .venv/wheels; installed with --no-deps so torch stays 2.13.0,
# plus the runtime packages the imported modules need. einops, pillow, pybase64, uvloop and
# prometheus_client are what building a real ModelConfig / VllmConfig imports: ModelConfig
# inspects the architecture in a subprocess that imports the model module (llama.py,
# deepseek_v2.py), which failed with "Model architectures [...] failed to be inspected"
# while any of them was missing. The stamp depends on this Makefile so a new dependency here
# reaches an existing .venv (the wheel is cached, so that re-run is a few pip installs).
VLLM_VERSION := 0.27.1
VLLM_RUNTIME_DEPS := regex psutil pyzmq urllib3 transformers cbor2 aiohttp requests openai-harmony \
	openai cloudpickle pyyaml py-cpuinfo msgspec cachetools blake3 pydantic \
	einops pillow pybase64 uvloop prometheus_client

vllm: $(VENV)/.vllm-installed

$(VENV)/.vllm-installed: $(VENV)/.installed Makefile
	@if ! ls $(VENV)/wheels/vllm-$(VLLM_VERSION)+empty-*.whl >/dev/null 2>&1; then \
		rm -rf $(VENV)/vllm-build && $(PY) -m venv $(VENV)/vllm-build && \
		$(PY) -c "import site; print(site.getsitepackages()[0])" > \
			$$($(VENV)/vllm-build/bin/python -c "import site; print(site.getsitepackages()[0])")/zz_main_venv.pth && \
		$(VENV)/vllm-build/bin/pip install --quiet "setuptools>=77.0.3,<81" "setuptools-scm>=8" \
			"setuptools-rust>=1.9" wheel "packaging>=24.2" jinja2 && \
		mkdir -p $(VENV)/wheels/src && \
		$(PY) tools/fetch_sdist.py vllm $(VLLM_VERSION) $(VENV)/wheels/src && \
		VLLM_TARGET_DEVICE=empty $(VENV)/vllm-build/bin/pip wheel --no-deps --no-build-isolation \
			$(VENV)/wheels/src/vllm-$(VLLM_VERSION).tar.gz -w $(VENV)/wheels && rm -rf $(VENV)/vllm-build; \
	fi
	$(PY) -m pip install --quiet --no-deps $(VENV)/wheels/vllm-$(VLLM_VERSION)+empty-*.whl
	$(PY) -m pip install --quiet $(VLLM_RUNTIME_DEPS) "torch==2.13.0"
	touch $@

gtest:
	@if [ ! -f /usr/include/gtest/gtest.h ] || [ ! -f /usr/lib/x86_64-linux-gnu/libgtest.a -a ! -f /usr/lib/libgtest.a ]; then \
		echo "installing libgtest-dev"; \
		$(SUDO) apt-get update -qq && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libgtest-dev; \
	fi
	@command -v ccache >/dev/null 2>&1 || { $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq ccache >/dev/null 2>&1 || true; }

$(BUILD)/build.ninja: CMakeLists.txt $(VENV)/.installed
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release -DPython_EXECUTABLE=$(abspath $(PY))

build: setup $(BUILD)/build.ninja
	cmake --build $(BUILD) -j $(JOBS)

test-cpp: build
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS)

test-python: build vllm
	$(PY) -m pytest tests/python -q

test: test-cpp test-python

demo: build
	PYTHONPATH=python:examples/demo $(PY) -m aar_demo
	PYTHONPATH=python:examples/demo $(PY) -m aar_demo --attention mla
	PYTHONPATH=python:examples/demo $(PY) -m aar_demo --attention sfa
	PYTHONPATH=python:examples/demo $(PY) -m aar_demo --attention dsa
	PYTHONPATH=python:examples/demo $(PY) -m aar_demo --dcp 2
	PYTHONPATH=python:examples/demo $(PY) -m aar_demo --attention sfa --dcp 2
	PYTHONPATH=python:examples/demo $(PY) -m aar_demo --attention dsa --dsa-cp 2

bench: build
	$(BUILD)/bench_host_cpp --out benchmarks/results/cpp_host.json
	$(BUILD)/bench_graph_cpp --out benchmarks/results/cpp_graph.json
	$(BUILD)/bench_mla_cpp --out benchmarks/results/cpp_mla.json
	$(BUILD)/bench_sfa_cpp --out benchmarks/results/cpp_sfa.json
	$(BUILD)/bench_dsa_cpp --out benchmarks/results/cpp_dsa.json
	$(BUILD)/bench_dsa_impl_cpp --out benchmarks/results/cpp_dsa_impl.json
	$(BUILD)/bench_dsa_oproj_cpp --out benchmarks/results/cpp_dsa_oproj.json
	$(BUILD)/bench_resident_lru_cpp --out benchmarks/results/cpp_resident_lru.json
	PYTHONPATH=python $(PY) benchmarks/bench_host.py --out benchmarks/results/python_host.json
	PYTHONPATH=python $(PY) benchmarks/bench_mla_host.py --out benchmarks/results/mla_host.json
	PYTHONPATH=python $(PY) benchmarks/bench_sfa_host.py --out benchmarks/results/sfa_host.json
	PYTHONPATH=python $(PY) benchmarks/bench_step.py --out benchmarks/results/step.json
	PYTHONPATH=python $(PY) benchmarks/bench_cp_comm.py --out benchmarks/results/cp_comm.json
	PYTHONPATH=python $(PY) benchmarks/bench_gqa_dcp.py --out benchmarks/results/gqa_dcp.json
	PYTHONPATH=python $(PY) benchmarks/bench_sfa_dcp.py --out benchmarks/results/sfa_dcp.json
	PYTHONPATH=python $(PY) benchmarks/bench_dsa_cp.py --out benchmarks/results/dsa_cp.json
	PYTHONPATH=python $(PY) benchmarks/bench_mla_cp.py --out benchmarks/results/mla_cp.json

# ---------------------------------------------------------------- sanitizers
# ASan + UBSan build of the libraries, the C++ tests, the examples and _C (no benchmarks), in
# its own directory; ctest with leak detection on, then the pytest suite against it (Python is
# not instrumented: libasan is preloaded and leak detection is off there, CPython's and torch's
# never-freed singletons are not ours). Options and suppressions: tools/sanitizers/.
ASAN_BUILD := build-asan
SAN_DIR    := $(abspath tools/sanitizers)
LIBASAN     = $(shell $(CXX) -print-file-name=libasan.so)
# libstdc++ is preloaded too: python is not linked against it, so without it ASan's __cxa_throw
# interceptor finds no real __cxa_throw and aborts at the first C++ exception.
LIBSTDCXX   = $(shell $(CXX) -print-file-name=libstdc++.so)
ASAN_ENV_CPP = ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:strict_init_order=1:detect_stack_use_after_return=0 \
	LSAN_OPTIONS=suppressions=$(SAN_DIR)/lsan.supp:print_suppressions=0 \
	UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1:suppressions=$(SAN_DIR)/ubsan.supp
ASAN_ENV_PY = ASAN_OPTIONS=detect_leaks=0:abort_on_error=0 \
	UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1:suppressions=$(SAN_DIR)/ubsan.supp \
	LD_PRELOAD="$(LIBASAN) $(LIBSTDCXX)"

$(ASAN_BUILD)/build.ninja: CMakeLists.txt $(VENV)/.installed
	cmake -S . -B $(ASAN_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Sanitize -DAAR_SANITIZE=address,undefined \
		-DAAR_BUILD_BENCHMARKS=OFF -DAAR_PKG_DIR=$(abspath $(ASAN_BUILD))/python/ascend_attn_rt \
		-DPython_EXECUTABLE=$(abspath $(PY))

build-asan: setup $(ASAN_BUILD)/build.ninja
	mkdir -p $(ASAN_BUILD)/python/ascend_attn_rt   # _C's post-build copy goes there
	cmake --build $(ASAN_BUILD) -j $(JOBS)
	cd python && find ascend_attn_rt -name '*.py' -exec cp --parents {} $(abspath $(ASAN_BUILD))/python/ \;  # subpackages too

test-sanitize: build-asan vllm
	$(ASAN_ENV_CPP) ctest --test-dir $(ASAN_BUILD) --output-on-failure -j $(JOBS)
	$(ASAN_ENV_PY) AAR_SANITIZED=1 AAR_BUILD_DIR=$(abspath $(ASAN_BUILD)) $(PY) -m pytest tests/python -q -p no:cacheprovider \
		--capture=sys -o pythonpath="$(ASAN_BUILD)/python tests/python"

# ThreadSanitizer build of the runtime and the concurrency suite only (tests/cpp/
# test_concurrency.cpp, ctest label "concurrency"), in its own directory. libtorch is not
# instrumented; halt_on_error makes any report a failure. Suppressions: tools/sanitizers/tsan.supp.
TSAN_BUILD := build-tsan
TSAN_ENV   = TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1:suppressions=$(SAN_DIR)/tsan.supp

$(TSAN_BUILD)/build.ninja: CMakeLists.txt $(VENV)/.installed
	cmake -S . -B $(TSAN_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Sanitize -DAAR_SANITIZE=thread \
		-DAAR_BUILD_BENCHMARKS=OFF -DAAR_BUILD_PYTHON=OFF -DPython_EXECUTABLE=$(abspath $(PY))

build-tsan: setup $(TSAN_BUILD)/build.ninja
	cmake --build $(TSAN_BUILD) -j $(JOBS) --target test_concurrency

test-tsan: build-tsan
	$(TSAN_ENV) ctest --test-dir $(TSAN_BUILD) -L concurrency --output-on-failure -j $(JOBS)

# ---------------------------------------------------------------- fuzzing
# libFuzzer targets over the plan layer (tests/fuzz/fuzz_*.cpp, ASan + UBSan), built with
# Debian's clang in a plan-only build. `make fuzz` runs each for FUZZ_SECONDS from the checked-in
# corpus (new inputs go to build-fuzz/corpus/, not the tree); `make fuzz-smoke` (CI) replays the
# checked-in corpus and fuzzes each target for FUZZ_SMOKE_SECONDS. A failure leaves the
# crashing input in build-fuzz/ (crash-*); add it to tests/fuzz/corpus/<target>/ and a
# GoogleTest in tests/cpp/test_plan_fuzz_regressions.cpp.
FUZZ_BUILD := build-fuzz
FUZZ_SECONDS ?= 60
FUZZ_SMOKE_SECONDS ?= 5
# A unit slower than this is a failure (libFuzzer's default, 1200 s, let a quadratic loop on a
# huge length stall a run for minutes).
FUZZ_TIMEOUT ?= 30
FUZZ_TARGETS = $(basename $(notdir $(wildcard tests/fuzz/fuzz_*.cpp)))

clang:
	@if ! command -v clang++ >/dev/null 2>&1; then \
		echo "installing clang"; \
		$(SUDO) apt-get update -qq && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq clang; \
	fi
	@v=$$(clang++ -dumpversion | cut -d. -f1); \
	if [ ! -f "$$(clang++ -print-resource-dir)/lib/linux/libclang_rt.fuzzer-x86_64.a" ]; then \
		echo "installing libclang-rt-$$v-dev (libFuzzer)"; \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libclang-rt-$$v-dev; \
	fi

$(FUZZ_BUILD)/build.ninja: CMakeLists.txt
	cmake -S . -B $(FUZZ_BUILD) -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=Release \
		-DAAR_PLAN_ONLY=ON -DAAR_BUILD_TESTS=OFF -DAAR_FUZZ=ON

build-fuzz: clang $(FUZZ_BUILD)/build.ninja
	cmake --build $(FUZZ_BUILD) -j $(JOBS)

# One line per target: inputs run, inputs/s, libFuzzer's coverage (cov: edges, ft: features).
fuzz: build-fuzz
	@for t in $(FUZZ_TARGETS); do \
		mkdir -p $(FUZZ_BUILD)/corpus/$$t; \
		$(FUZZ_BUILD)/$$t -max_total_time=$(FUZZ_SECONDS) -timeout=$(FUZZ_TIMEOUT) -print_final_stats=1 -artifact_prefix=$(FUZZ_BUILD)/$$t- \
			$(FUZZ_BUILD)/corpus/$$t tests/fuzz/corpus/$$t > $(FUZZ_BUILD)/$$t.log 2>&1 \
			|| { tail -40 $(FUZZ_BUILD)/$$t.log; exit 1; }; \
		tools/fuzz_stats.sh $$t $(FUZZ_BUILD)/$$t.log; \
	done

fuzz-smoke: build-fuzz
	@for t in $(FUZZ_TARGETS); do \
		rm -rf $(FUZZ_BUILD)/smoke/$$t && mkdir -p $(FUZZ_BUILD)/smoke/$$t; \
		$(FUZZ_BUILD)/$$t -max_total_time=$(FUZZ_SMOKE_SECONDS) -timeout=$(FUZZ_TIMEOUT) -print_final_stats=1 -artifact_prefix=$(FUZZ_BUILD)/$$t- \
			$(FUZZ_BUILD)/smoke/$$t tests/fuzz/corpus/$$t > $(FUZZ_BUILD)/$$t.smoke.log 2>&1 \
			|| { tail -40 $(FUZZ_BUILD)/$$t.smoke.log; exit 1; }; \
		tools/fuzz_stats.sh $$t $(FUZZ_BUILD)/$$t.smoke.log; \
	done

# Builds the wheel (a full Release build of its own, ~5-8 min) and checks it as installed:
# Python suites against the installed package, the CMake examples against its tree (not in CI).
wheel-check: setup vllm
	tools/check_wheel.sh

# The package installed as a user beside PyPI's torch installs it (tools/check_install_cuda_torch.sh):
# a fresh venv with PyPI's default torch of the supported range (on x86_64 a CUDA build: 5.5 GB,
# 1.5-3 min to create here), `pip install --no-build-isolation` of a clean copy of the tree with no
# CUDA toolkit findable, then one forward and the C++ examples against the installed package.
# Not in `make test` (the venv alone costs more than the CI budget allows); `make test` configures
# against a CUDA-build stand-in instead (tests/python/test_packaging.py).
install-check-cuda-torch:
	tools/check_install_cuda_torch.sh

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(TSAN_BUILD) $(FUZZ_BUILD)
