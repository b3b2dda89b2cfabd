# Quick start: `make demo` and `make test` on a fresh clone. Everything installs into .venv.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
export DAGSTER_HOME := $(CURDIR)/dagster_home

.PHONY: install install-dev demo test ui lint bench clean-demo

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e .
	touch $@

$(VENV)/.installed-dev: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@ $(VENV)/.installed

install: $(VENV)/.installed

install-dev: $(VENV)/.installed-dev

## Generate the demo datasets if missing, materialize every asset of every partition, summarize.
demo: install
	$(BIN)/radharmony demo

## The whole test suite.
test: install-dev
	$(BIN)/pytest

## The Dagster UI on the demo's instance: http://127.0.0.1:3000
ui: install
	$(BIN)/dagster dev -w workspace.yaml -h 127.0.0.1 -p 3000

lint: install-dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

bench: install
	$(BIN)/python benchmarks/bench_index.py
	$(BIN)/python benchmarks/bench_masks.py
	$(BIN)/python benchmarks/bench_images.py
	$(BIN)/python benchmarks/bench_time_limit.py

clean-demo:
	rm -rf data/demo data/output
	find dagster_home -mindepth 1 ! -name dagster.yaml -exec rm -rf {} +
