# Quick start: `make demo` trains the demo, `make test` runs the test suite.
# Both create ./.venv (override with VENV=...) and install what they need,
# with torch pinned by requirements/constraints.txt.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip install --quiet -c requirements/constraints.txt
CONFIG ?= projects/digits_demo/configs/demo/resnet-mini_1xb64-precise-bn-stats_digits.py
WORK_DIR ?= work_dirs/demo
LINT_PATHS := mmstats tools tests projects setup.py
TEST_PATHS := tests projects/digits_demo/tests
# pytest-xdist workers (the distributed tests all go to one of them)
TEST_WORKERS ?= 2
PYTEST := $(PY) -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadgroup

.PHONY: install demo test test-quick test-gpu lint docs benchmark clean

$(VENV)/.installed: setup.py projects/digits_demo/setup.py requirements/*.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PIP) -e '.[tests,lint,docs]' -e projects/digits_demo
	touch $@

install: $(VENV)/.installed

demo: install
	$(PY) tools/train.py $(CONFIG) --work-dir $(WORK_DIR)

# Everything (CI): single-process tests on $(TEST_WORKERS) workers, the
# gloo-rank tests on one of them (one pool of ranks for the session).
test: install
	$(PYTEST) $(TEST_PATHS)

# The inner loop: single-process unit tests (no Runner, no gloo ranks, no
# subprocesses, no torch.compile); markers set in tests/conftest.py.
test-quick: install
	$(PYTEST) -m "not dist and not runner and not slow" $(TEST_PATHS)

# On a machine with CUDA (skipped elsewhere).
test-gpu: install
	$(PY) -m pytest tests/cuda -q -p no:cacheprovider

lint: install
	$(PY) -m flake8 $(LINT_PATHS)
	$(PY) -m isort --check-only --diff $(LINT_PATHS)
	$(PY) -m yapf --diff --recursive $(LINT_PATHS)

docs: install
	$(PY) -m sphinx -W -q -b html docs docs/_build/html

benchmark: install
	$(PIP) -e '.[benchmarks]'
	$(PY) tools/benchmarks/precise_bn.py
	$(PY) tools/benchmarks/report.py

clean:
	rm -rf $(VENV) work_dirs *.egg-info docs/_build
