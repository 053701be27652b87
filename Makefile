# Two commands do all the set-up on a fresh machine:
#   make train   -- builds .venv if missing, trains the default model (configs/lm_shakespeare.py)
#   make test    -- builds .venv if missing, runs the whole test suite
#   make test-isa -- the numerics-sensitive tests as users' runs compile them: natively, then
#                    under XLA's AVX2 and SSE4_2 caps (scripts/test_isa.py)
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
WORKDIR ?= runs/lm_shakespeare
CONFIG ?= configs/lm_shakespeare.py
PYTEST_ARGS ?=
# Three pytest workers on two cores: a third keeps the CPU busy while a test waits on its
# subprocesses, the storage emulator or Ray (docs/TESTING.md, "Where the time goes").
TEST_WORKERS ?= 3

.PHONY: train test test-isa lint format lock clean-venv

$(VENV)/.installed: pyproject.toml requirements-lock.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c requirements-lock.txt -e '.[test,sweep]'
	touch $@

train: $(VENV)/.installed
	$(PY) train.py --config $(CONFIG) --workdir $(WORKDIR)

test: $(VENV)/.installed
	$(PY) -m ruff check .
	$(PY) -m pytest -n $(TEST_WORKERS) --dist worksteal $(PYTEST_ARGS)

test-isa: $(VENV)/.installed
	$(PY) scripts/test_isa.py $(PYTEST_ARGS)

lint: $(VENV)/.installed
	$(PY) -m ruff check . && $(PY) -m ruff format --check .

format: $(VENV)/.installed
	$(PY) -m ruff format . && $(PY) -m ruff check --fix .

# The header comments stay; local version labels (torch's '+cpu') are dropped, since a plain
# package index does not serve them.
lock: $(VENV)/.installed
	{ grep '^#' requirements-lock.txt; $(PY) -m pip freeze --exclude-editable \
	  | grep -vE '^transformer( @|==)' | sed -E 's/^([^=]+==[^+]+)[+].*$$/\1/'; } > requirements-lock.txt.new
	mv requirements-lock.txt.new requirements-lock.txt

clean-venv:
	rm -rf $(VENV)
