# Two commands do all the set-up on a fresh machine:
#   make test   builds everything and runs every C++ and Python test
#   make demo   builds and runs the continuous-batching demo
# Both create .venv, install torch 2.13.0 (CPU) and the Python dependencies, and
# install libgtest-dev through apt when it is missing.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
BUILD  := build
JOBS   ?= $(shell nproc)
SUDO   := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: all setup venv vllm gtest build test test-cpp test-python demo bench clean

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
# plus the runtime packages the imported modules need.
VLLM_VERSION := 0.27.1
VLLM_RUNTIME_DEPS := regex psutil pyzmq urllib3 transformers cbor2 aiohttp requests openai-harmony \
	openai cloudpickle pyyaml py-cpuinfo msgspec cachetools blake3 pydantic

vllm: $(VENV)/.vllm-installed

$(VENV)/.vllm-installed: $(VENV)/.installed
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
	PYTHONPATH=python $(PY) -m ascend_attn_rt demo
	PYTHONPATH=python $(PY) -m ascend_attn_rt demo --attention mla
	PYTHONPATH=python $(PY) -m ascend_attn_rt demo --attention sfa
	PYTHONPATH=python $(PY) -m ascend_attn_rt demo --attention dsa
	PYTHONPATH=python $(PY) -m ascend_attn_rt demo --dcp 2

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
	PYTHONPATH=python $(PY) benchmarks/bench_cp_comm.py --out benchmarks/results/cp_comm.json
	PYTHONPATH=python $(PY) benchmarks/bench_gqa_dcp.py --out benchmarks/results/gqa_dcp.json

clean:
	rm -rf $(BUILD)
