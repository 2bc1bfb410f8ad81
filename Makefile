# Two commands on a fresh machine (see README):
#   make serve   set up, build the site, serve it with the compute server on http://127.0.0.1:8000
#   make test    set up (Python packages, Debian's Chromium, Pyodide from npm) and run the whole suite
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
HOST ?= 127.0.0.1
PORT ?= 8000
# The eviction parity tests' reference (see pyproject.toml, test extra): without its declared dependencies,
# which would replace the installed transformers; the tests stub what it imports but never uses.
KVPRESS := kvpress==0.5.5
# The radix tree's side-by-side test runs SGLang's own RadixCache code (tests/explainers/test_radix_against_sglang.py):
# only its mem_cache sources are unpacked from the released wheel (the wheel's dependencies are never installed).
SGLANG := sglang==0.5.23
SGLANG_SRC := .cache/sglang-0.5.23

.PHONY: serve test build setup chromium pyodide bench sglang-src

$(BIN)/kvx: pyproject.toml setup.py
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q -e '.[kernels,hf,test]'
	$(BIN)/pip install -q --no-deps '$(KVPRESS)'
	$(BIN)/kvx build-kernels    # the server's fused CPU kernels, for this CPU (seconds; without cc, PyTorch runs)
	touch $@

setup: $(BIN)/kvx

# Debian's Chromium for the browser tests; never a browser downloaded by playwright.
chromium:
	@test -x /usr/bin/chromium || { apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium fonts-dejavu-core >/dev/null; }

# Pyodide core from the npm registry, pinned and checked against its integrity hash.
pyodide: $(BIN)/kvx
	$(BIN)/python -c "from kvx.site.vendor import pyodide_tarball; print('pyodide:', pyodide_tarball())"

build: $(BIN)/kvx pyodide
	$(BIN)/kvx build build/site

serve: build
	$(BIN)/kvx serve --host $(HOST) --port $(PORT) --site build/site

sglang-src: $(SGLANG_SRC)/sglang/srt/mem_cache/radix_cache.py

$(SGLANG_SRC)/sglang/srt/mem_cache/radix_cache.py: | $(BIN)/kvx
	$(BIN)/pip download -q --no-deps -d .cache/wheels '$(SGLANG)'
	$(BIN)/python -c "import glob, zipfile; z = zipfile.ZipFile(glob.glob('.cache/wheels/sglang-0.5.23-*.whl')[0]); \
	  z.extractall('$(SGLANG_SRC)', [n for n in z.namelist() if n.startswith('sglang/srt/mem_cache/')])"

test: $(BIN)/kvx chromium pyodide sglang-src
	KVX_SGLANG_SRC=$(SGLANG_SRC) $(BIN)/python -m pytest

bench: build chromium
	$(BIN)/python tests/benchmarks/bench_pages.py --site build/site
	$(BIN)/python tests/benchmarks/bench_kernels.py
	$(BIN)/python tests/benchmarks/bench_radix.py         # radix replay growth, 10% -> 100% of a 12,000-request trace
	$(BIN)/python tests/benchmarks/bench_server.py
	$(BIN)/python tests/benchmarks/load_server.py --site build/site
	$(BIN)/python tests/benchmarks/report.py      # -> benchmarks/REPORT.md and benchmarks/report.json

# On a machine with a CUDA GPU (under 10 minutes on an H100/H200): kernel tests on the GPU (with CPU/GPU
# agreement), every kernel endpoint through the server, the kernel benchmark against SDPA/flash and HBM
# bandwidth, peak GPU memory per kernel -> benchmarks/gpu-report.md and .json. `--smoke` is the CPU dry run.
.PHONY: gpu-check
gpu-check: $(BIN)/kvx
	$(BIN)/python tests/benchmarks/gpu_check.py
