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

.PHONY: install demo test test-gpu lint docs benchmark clean

$(VENV)/.installed: setup.py projects/digits_demo/setup.py requirements/*.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PIP) -e '.[tests,lint,docs]' -e projects/digits_demo
	touch $@

install: $(VENV)/.installed

demo: install
	$(PY) tools/train.py $(CONFIG) --work-dir $(WORK_DIR)

test: install
	$(PY) -m pytest tests projects/digits_demo/tests -q -p no:cacheprovider

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
