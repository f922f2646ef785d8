# qw — the commands a newcomer needs. Each target installs what it uses into .venv first.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
WORKERS ?= 8
ARGS   ?=

.PHONY: up test test-all lint bench bench-partitions attack clean compiled

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# The runtime install (what `qw up` needs) and the test/bench extras, each stamped so that
# they rerun only when pyproject.toml changes.
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e '.[compiled]'
	touch $@

$(VENV)/.installed-test: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e '.[test]'
	touch $@

$(VENV)/.installed-bench: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e '.[test,bench]'
	touch $@

## compiled: build the fold's and the worker loop's modules with mypyc (queue_worker.compiled),
## the frame loop in C (logstore.native) and the claims decoder in C (queue_worker.cdecode);
## a no-op when the build of the current sources exists. Without a C compiler it says so and
## the Python runs (QW_REQUIRE_COMPILED=1 makes that an error, as in CI).
compiled: $(VENV)/.installed
	$(BIN)/python -m queue_worker.build_compiled

## up: run qw with $(WORKERS) workers on ./.qw (the live dashboard in a terminal), with
## demo traffic (--demo: demo tasks at 80% of what the workers can do)
up: $(VENV)/.installed compiled
	$(BIN)/qw up --workers $(WORKERS) --demo $(ARGS)

## test: the test suite (includes a short chaos run; QW_CHAOS=long for the long one)
test: $(VENV)/.installed-test compiled
	$(BIN)/python -m pytest -q $(ARGS)

## lint: ruff and mypy (strict)
lint: $(VENV)/.installed-test
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

## attack: the attack list (tests/attacks): held / degraded / broken per attack
attack: $(VENV)/.installed-test
	$(BIN)/python -m tests.attacks $(ARGS)

## bench: every benchmark in one run; writes bench/results.md
bench: $(VENV)/.installed-bench compiled
	$(BIN)/python -m bench.run_all $(ARGS)

## bench-partitions: 8 workers over 1, 2, 4, 8 partitions; writes bench/results-partitions.md
bench-partitions: $(VENV)/.installed-bench
	$(BIN)/python -m bench.partitions_bench $(ARGS)

clean:
	rm -rf $(VENV) .qw queue_worker/_compiled queue_worker/_compiled_c logstore/_compiled supervisor/_compiled .mypy_cache .ruff_cache .pytest_cache
