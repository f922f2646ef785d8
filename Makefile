# qw — the commands a newcomer needs. Each target installs what it uses into .venv first.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
WORKERS ?= 8
ARGS   ?=

.PHONY: up test test-all lint bench bench-partitions attack clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# The runtime install (what `qw up` needs) and the test/bench extras, each stamped so that
# they rerun only when the build's inputs change: pip builds the C decoder (setup.py) with the
# install, optional (without a C compiler the build says so and the Python runs).
BUILD_INPUTS := pyproject.toml setup.py queue_worker/protocol/_cdecode.c queue_worker/protocol/_framewalk.h

$(VENV)/.installed: $(BUILD_INPUTS) | $(BIN)/python
	$(BIN)/pip install -q -e .
	touch $@

$(VENV)/.installed-test: $(BUILD_INPUTS) | $(BIN)/python
	$(BIN)/pip install -q -e '.[test]'
	touch $@

$(VENV)/.installed-bench: $(BUILD_INPUTS) | $(BIN)/python
	$(BIN)/pip install -q -e '.[test,bench]'
	touch $@

## up: run qw with $(WORKERS) workers on ./.qw (the live dashboard in a terminal), with
## demo traffic (--demo: demo tasks at 80% of what the workers can do)
up: $(VENV)/.installed
	$(BIN)/qw up --workers $(WORKERS) --demo $(ARGS)

## test: the fast tier, three test processes at once (the tests spend much of their time
## waiting on real processes; docs/running.md, "The tests"): every module, every kill -9 path, the
## real terminal, Redis and the browser at least once (tests marked `slow` are left out,
## and each property draws a fifth of its examples: tests/examples.py)
test: $(VENV)/.installed-test
	$(BIN)/python -m pytest -q -n 3 -m "not slow" $(ARGS)

## test-all: every test, the slow ones too, and each property's full count of examples
## (includes a short chaos run; QW_CHAOS=long for the long one)
test-all: $(VENV)/.installed-test
	QW_TESTS=all $(BIN)/python -m pytest -q -n 3 $(ARGS)

## lint: ruff and mypy (strict)
lint: $(VENV)/.installed-test
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

## attack: the attack list (tests/attacks): held / degraded / broken per attack
attack: $(VENV)/.installed-test
	$(BIN)/python -m tests.attacks $(ARGS)

## bench: every benchmark in one run; writes bench/results.md
bench: $(VENV)/.installed-bench
	$(BIN)/python -m bench.run_all $(ARGS)

## bench-partitions: 8 workers over 1, 2, 4, 8 partitions; writes bench/results-partitions.md
bench-partitions: $(VENV)/.installed-bench
	$(BIN)/python -m bench.partitions_bench $(ARGS)

clean:
	rm -rf $(VENV) .qw build queue_worker/_cdecode.*.so .mypy_cache .ruff_cache .pytest_cache
