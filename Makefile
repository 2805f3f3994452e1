# Quick start: `make demo` trains the demo, `make test` runs the test suite.
# Both create ./.venv (override with VENV=...) and install what they need,
# with torch pinned by requirements/constraints.txt.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
CONFIG ?= configs/demo/resnet-mini_1xb64-precise-bn-stats_digits.py
WORK_DIR ?= work_dirs/demo

.PHONY: install demo test benchmark clean

$(VENV)/.installed: setup.py requirements/runtime.txt requirements/tests.txt requirements/constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c requirements/constraints.txt -e '.[tests]'
	touch $@

install: $(VENV)/.installed

demo: install
	$(PY) tools/train.py $(CONFIG) --work-dir $(WORK_DIR)

test: install
	$(PY) -m pytest tests -q -p no:cacheprovider

benchmark: install
	$(PY) -m pip install --quiet -c requirements/constraints.txt -e '.[benchmarks]'
	$(PY) tools/benchmarks/precise_bn.py
	$(PY) tools/benchmarks/report.py

clean:
	rm -rf $(VENV) work_dirs *.egg-info
