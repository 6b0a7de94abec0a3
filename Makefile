# Two set-up commands on a fresh machine: `make demo` and `make test` (see README).
# `make demo` installs the runtime dependencies only (no test extras): .ci/run runs it first, in a
# fresh virtualenv, so a module importing an undeclared package fails CI as it would a new user.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# torch is a demo/test dependency only; the exact version takes the CPU wheel on disk
# (asking for plain `torch` would let the resolver pull a multi-GB CUDA build).
TORCH_SPEC ?= torch==2.13.0

.PHONY: demo test test-fast system-deps bench fuzz asan lint clean

$(VENV)/.base-installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q $(TORCH_SPEC)
	$(PIP) install -q -e '.[s3,postgres,ui]'
	touch $@

$(VENV)/.test-installed: $(VENV)/.base-installed
	$(PIP) install -q -e '.[s3,postgres,ui,scale,test]'
	touch $@

demo: $(VENV)/.base-installed
	$(VENV)/bin/kscope demo

system-deps:
	scripts/setup-test-system.sh

test: $(VENV)/.test-installed system-deps
	$(PY) -m pytest

# Everything but the real multi-process jobs and the browser: for quick local iteration.
test-fast: $(VENV)/.test-installed
	$(PY) -m pytest -m "not slow and not browser"

# The fuzz suite with 20x the CI budget and fresh random inputs (CI runs it with fixed seeds
# as part of `make test`); KSCOPE_FUZZ_BUDGET=100 make fuzz for a longer run.
fuzz: $(VENV)/.test-installed
	KSCOPE_FUZZ_BUDGET=$${KSCOPE_FUZZ_BUDGET:-20} KSCOPE_FUZZ_RANDOM=$${KSCOPE_FUZZ_RANDOM:-1} HYPOTHESIS_PROFILE=$${HYPOTHESIS_PROFILE:-fuzz} \
		$(PY) -m pytest tests/fuzz -q -p no:cacheprovider --timeout=0

$(VENV)/.lint-installed: $(VENV)/.test-installed
	$(PIP) install -q -e '.[s3,postgres,ui,scale,test,lint]'
	touch $@

# ruff (rules and format), mypy (strict on protocol/, trace/, analysis/, diagnosis/; config in pyproject.toml)
# and the import layers (lint-imports, docs/architecture.md). The pre-commit hooks run the same.
lint: $(VENV)/.lint-installed
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

# The native trace decoder built with AddressSanitizer + UBSan, then its tests and fuzz suite
# once (any out-of-bounds access or undefined behaviour aborts the run); the normal build is
# restored afterwards. A Python host needs libasan preloaded (docs/trace-loading.md); -s keeps a
# sanitizer report on the terminal (pytest's capture would swallow it when the process aborts).
ASAN_FLAGS := -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -g -O1
asan: $(VENV)/.test-installed
	@set -e; trap 'KSCOPE_NATIVE_CFLAGS= $(PY) setup.py -q build_ext --inplace --force >/dev/null' EXIT; \
	KSCOPE_NATIVE_CFLAGS="$(ASAN_FLAGS)" $(PY) setup.py -q build_ext --inplace --force; \
	LD_PRELOAD="$$(gcc -print-file-name=libasan.so) $$(gcc -print-file-name=libubsan.so)" \
	ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	KSCOPE_FUZZ_BUDGET=$${KSCOPE_FUZZ_BUDGET:-1} $(PY) -m pytest tests/trace/test_native.py tests/fuzz/test_native_fuzz.py \
		-q -s -p no:cacheprovider --timeout=0

bench: $(VENV)/.test-installed
	$(PY) benchmarks/bench_daemon.py
	$(PY) benchmarks/bench_analyze.py

clean:
	rm -rf $(VENV) build dist *.egg-info
