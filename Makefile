# Quick start: `make demo` trains the demo, `make test` runs the test suite.
# Both use ./.venv (override with VENV=...), with torch and the rest pinned by
# requirements/constraints.txt. `make demo` installs mmstats, the demo and
# what they import (requirements/runtime.txt, mminstall.txt, torch.txt,
# demo.txt) and nothing else;
# `make test`, `make lint` and `make docs` add the tests', linters' and
# docs' tools (requirements/tests.txt) to the same environment.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# --no-compile: Python compiles what it imports when it first imports it;
# compiling every file of torch, scipy and sympy at install time costs more
# than the whole demo run.
PIP := $(PY) -m pip install --quiet --no-compile -c requirements/constraints.txt
DEPS := setup.py projects/digits_demo/setup.py requirements/*.txt
CONFIG ?= projects/digits_demo/configs/demo/resnet-mini_1xb64-precise-bn-stats_digits.py
WORK_DIR ?= work_dirs/demo
LINT_PATHS := mmstats tools tests projects setup.py
TEST_PATHS := tests projects/digits_demo/tests
# pytest-xdist workers (the distributed tests all go to one of them)
TEST_WORKERS ?= 2
PYTEST := $(PY) -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadgroup

.PHONY: install demo test test-checkpoints test-preemption test-benchmarks test-quick test-gpu lint docs benchmark clean

# The demo's environment: the pinned requirements first, then mmstats and
# the demo as editable packages (their requirements are those files; no
# isolated build environment to set up for them).
$(VENV)/.installed-demo: $(DEPS)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) -r requirements/runtime.txt -r requirements/mminstall.txt \
		-r requirements/torch.txt -r requirements/demo.txt
	$(PIP) --no-deps --no-build-isolation -e . -e projects/digits_demo
	touch $@

# The development environment: the demo's plus pytest, DeepSpeed, W&B
# (the tests), flake8/isort/yapf and Sphinx.
# Then the bytecode of every installed package, once (-j 0: every core;
# files already compiled are skipped). The suite starts ~100 Python
# processes (gloo ranks, launches, the tools); where PYTHONDONTWRITEBYTECODE
# is set, as on our machines, each compiled torch's, mmengine's and
# DeepSpeed's sources again: 10 s of CPU per process instead of 4 s, 170 s
# of a 350 s `make test` on a fresh clone. compileall's exit status is not
# ours: torch ships a test file in Python 3.12 syntax.
$(VENV)/.installed: $(VENV)/.installed-demo
	$(PIP) -r requirements/tests.txt
	$(PY) -m compileall -qq -j 0 "$$($(PY) -c 'import sysconfig; print(sysconfig.get_path("purelib"))')" || true
	touch $@

install: $(VENV)/.installed

# One torch thread: the demo's model is small, and on a busy 2-core machine
# torch's default (a thread per core) waits on the other load (257 s against
# 47 s for the same run at load average 6). OMP_NUM_THREADS=N overrides it.
OMP_NUM_THREADS ?= 1
demo: $(VENV)/.installed-demo
	OMP_NUM_THREADS=$(OMP_NUM_THREADS) $(PY) tools/train.py $(CONFIG) --work-dir $(WORK_DIR)

# Everything but the checkpoint matrix: single-process tests on
# $(TEST_WORKERS) workers, the gloo-rank tests on one of them (one pool of
# ranks for the session). The checkpoint matrix (test_checkpoints.py: 8
# strategies x 20 two-process launches, ~4 min alone) is
# `make test-checkpoints`; .ci/run runs both, and the ends of the version
# matrix (`make test-ends`).
test: install
	$(PYTEST) -m "not checkpoint_matrix and not preemption_matrix and not benchmarks" $(TEST_PATHS)

test-checkpoints: install
	$(PYTEST) -m checkpoint_matrix $(TEST_PATHS)

# Kills and preemption signals, then --resume, under DDP, FSDP2 (both
# formats) and ZeRO-3 (test_preemption.py: 4 x 5 two-process launches);
# ~6.5 min alone, not in .ci/run: run it where checkpoints change.
test-preemption: install
	$(PYTEST) -m preemption_matrix $(TEST_PATHS)

# Every script of tools/benchmarks at a tiny size (--smoke): exits 0 and
# prints its figure lines (tests/test_tools/test_benchmarks.py). A process
# each, most training the demo: ~3 min of CPU, a target of its own beside
# make test (.ci/run runs both) so that the inner loop stays short.
test-benchmarks: install
	$(PYTEST) -m benchmarks $(TEST_PATHS)

# The inner loop: single-process unit tests (no Runner, no gloo ranks, no
# subprocesses, no torch.compile); markers set in tests/conftest.py.
test-quick: install
	$(PYTEST) -m "not dist and not runner and not slow" $(TEST_PATHS)

# The version matrix (docs/compat.md): the whole suite on every stack of
# requirements/stacks/ and the pinned one, each in a cached venv outside
# the checkout (~/.cache/mmstats/stacks; ~2-4 min to build each, once);
# the table in work_dirs/matrix/table.md. STACKS="..." picks some.
.PHONY: test-matrix test-ends
test-matrix:
	bash tools/stacks/matrix.sh

# CI's ends of the matrix: the quick tests on the oldest torch. The newest
# (2.14.1) is the pinned one: `make test` runs everything on it.
test-ends:
	STACKS="torch2.1" bash tools/stacks/matrix.sh \
		-m "not dist and not runner and not slow"

# On a machine with CUDA (skipped elsewhere).
test-gpu: install
	$(PY) -m pytest tests/cuda -q -p no:cacheprovider

lint: install
	$(PY) -m flake8 $(LINT_PATHS)
	$(PY) -m isort --check-only --diff $(LINT_PATHS)
	$(PY) -m yapf --diff --recursive $(LINT_PATHS)

docs: install
	$(PY) -m sphinx -W -q -b html docs docs/_build/html

# Opt-in, never in CI: OpenMMLab's packages trained with their own configs
# and tools/train.py on 1 and 2 CPU processes, mmstats' hooks on, every
# number recomputed. STACK=upstream (default: mmdet 3.3.0, mmsegmentation
# 1.2.2) or STACK=onedl (the maintained fork: onedl-mmdetection 3.5.1,
# onedl-mmsegmentation 1.4.2, onedl-mmpretrain 1.3.6). Builds what it needs
# once, outside $(VENV): the mmcv's CPU ops (~40 min;
# ~/.cache/mmstats/wheels) and .venv-downstream[-onedl] (mmcv and the main
# venv's mmcv-lite are one module).
STACK ?= upstream
.PHONY: test-downstream
test-downstream:
	DOWNSTREAM_STACK=$(STACK) bash tools/downstream/run.sh

benchmark: install
	$(PIP) -e '.[benchmarks]'
	$(PY) tools/benchmarks/precise_bn.py
	$(PY) tools/benchmarks/report.py

clean:
	rm -rf $(VENV) work_dirs *.egg-info docs/_build
