# One-command entry points. `make test` creates .venv, installs the CPU torch wheel and the
# project with its dev extras, then runs ruff, mypy and the test suite.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: install test lint typecheck quickstart bench clean mutate

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

install: $(BIN)/python
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e ".[dev]"

# The suite runs on every core (pytest-xdist; tests set one torch thread each).
test: install
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/python -m pytest -q -n auto --dist worksteal

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# Static type check of the package (configuration in pyproject.toml, [tool.mypy]).
typecheck: install
	$(BIN)/mypy

quickstart: install
	$(BIN)/python -m neuralblock.quickstart

bench: install
	$(BIN)/python benchmarks/gibbs_throughput.py

# Curated mutation testing of the kernel hot paths (issue 25): each mutant runs in a temporary git worktree
# of HEAD with only its file's tests; writes benchmarks/results/mutation_report.{md,json}. Not part of CI.
mutate: install
	$(BIN)/python benchmarks/mutate.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .mypy_cache
