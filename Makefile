# Quick start: `make demo` and `make test` on a fresh clone. Everything installs into .venv.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# The demo's instance unless DAGSTER_HOME is set (a run on your downloads has its own).
DAGSTER_HOME ?= $(CURDIR)/dagster_home
export DAGSTER_HOME
# The tests start hundreds of Python processes (`dg launch`, the CLIs, Dagster's run workers,
# the benchmark smokes), each importing the package: compiled once and kept in __pycache__
# (git-ignored), it is read instead of compiled each time, even where a shell asks otherwise.
unexport PYTHONDONTWRITEBYTECODE
# Where `make ui` listens: loopback unless HOST says otherwise.
HOST ?= 127.0.0.1
PORT ?= 3000
# tests/test_e2e_ui.py drives Debian's chromium through Playwright (no browser download).
CHROMIUM ?= /usr/bin/chromium
APT_GET ?= apt-get
CHROMIUM_INSTALL := $(APT_GET) update -qq && DEBIAN_FRONTEND=noninteractive $(APT_GET) install -y -q chromium

.PHONY: install install-dev install-bench chromium demo test test-fast coverage ui docs lint bench clean-demo

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e .
	touch $@

$(VENV)/.installed-dev: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@ $(VENV)/.installed

# The `bench` extra: MONAI and torch 2.13.0 (CPU) for bench_images.py's MONAI comparison.
$(VENV)/.installed-bench: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e '.[bench]'
	touch $@ $(VENV)/.installed

install: $(VENV)/.installed

install-dev: $(VENV)/.installed-dev

install-bench: $(VENV)/.installed-bench

## Debian's chromium for the UI test: installed when missing (as root), else the command to run.
chromium:
	@if [ ! -x "$(CHROMIUM)" ]; then \
		if [ "$$(id -u)" = 0 ] && command -v $(firstword $(APT_GET)) >/dev/null; then \
			echo "$(CHROMIUM) is missing; installing Debian's chromium ..."; \
			$(CHROMIUM_INSTALL) || { echo "installing chromium failed; run as root:" \
				"$(CHROMIUM_INSTALL)" >&2; exit 1; }; \
		else \
			echo "tests/test_e2e_ui.py needs Debian's chromium at $(CHROMIUM); run as root:" \
				"$(CHROMIUM_INSTALL)" >&2; exit 1; \
		fi; \
	fi

## Generate the demo datasets if missing, build everything (every partition's stages, the
## manifest, the exports, the dataset card), summarize and print where each output is.
## Always on the demo's own instance, whatever DAGSTER_HOME a shell set up for real data.
demo: install
	DAGSTER_HOME=$(CURDIR)/dagster_home $(BIN)/radharmony demo

## The whole test suite, after installing what it needs (Python packages, chromium), in two
## processes, a test module at a time in file-name order (so a module's fixtures are built in
## one process). `make test PYTEST_ARGS=` runs it in one process.
PYTEST_ARGS ?= -n 2 --dist loadfile --no-loadscope-reorder
test: install-dev chromium s3-server
	$(BIN)/pytest $(PYTEST_ARGS)

## The quick check of a change: every test that no tier marker (pyproject.toml) sets aside, so
## no builds, services, subprocess CLIs or browser (no chromium, no root); in two processes
## that take tests from each other's queue when idle (worksteal: the tests' durations differ).
FAST_TIER := not (build or slow or cluster or browser)
test-fast: install-dev
	$(BIN)/pytest -n 2 --dist worksteal -m "$(FAST_TIER)"

## What no test reaches: the whole suite under coverage, the package's unreached lines listed
## per module (runs launched in subprocesses, `dg launch` and the CLIs, are not counted).
coverage: install-dev chromium s3-server
	$(BIN)/pytest $(PYTEST_ARGS) --cov=radharmony_pipeline --cov-report=term-missing:skip-covered

## The Dagster UI on $(DAGSTER_HOME) (the demo's by default): http://$(HOST):$(PORT)
## `dg dev`, which supersedes `dagster dev`, loads the project from pyproject.toml's [tool.dg];
## VIRTUAL_ENV tells it the project's .venv is the one in use.
ui: install
	VIRTUAL_ENV=$(abspath $(VENV)) $(BIN)/dg dev --host $(HOST) --port $(PORT)

## docs/tables.md from the declared table schemas (tests/test_tables_doc.py checks it).
docs: install
	$(BIN)/python -m radharmony_pipeline.processing.tables.tables_doc

lint: install-dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

bench: install-bench
	$(BIN)/python benchmarks/bench_checks.py --section index
	$(BIN)/python benchmarks/bench_masks.py
	$(BIN)/python benchmarks/bench_images.py
	$(BIN)/python benchmarks/bench_duplicates.py
	$(BIN)/python benchmarks/bench_cluster.py --section time-limit

clean-demo:
	rm -rf data/demo data/output
	find dagster_home -mindepth 1 ! -name dagster.yaml -exec rm -rf {} +

## The disk-backed S3 server the tests and rehearsals start on loopback (tests/s3_server.js):
## s3rver from the npm registry, as package.json and package-lock.json pin it, into
## node_modules. Node.js and npm are Debian's `nodejs` (installed when missing, as root).
NPM ?= npm
NODE_INSTALL := $(APT_GET) update -qq && DEBIAN_FRONTEND=noninteractive $(APT_GET) install -y -q nodejs npm

node_modules/.installed: package.json package-lock.json
	@if ! command -v $(NPM) >/dev/null; then \
		if [ "$$(id -u)" = 0 ] && command -v $(firstword $(APT_GET)) >/dev/null; then \
			echo "npm is missing; installing Debian's nodejs ..."; \
			$(NODE_INSTALL) || { echo "installing nodejs failed; run as root: $(NODE_INSTALL)" >&2; exit 1; }; \
		else \
			echo "the S3 server of the tests needs Node.js and npm; run as root: $(NODE_INSTALL)" >&2; exit 1; \
		fi; \
	fi
	$(NPM) ci --no-audit --no-fund --loglevel=error
	touch $@

.PHONY: s3-server
s3-server: node_modules/.installed
