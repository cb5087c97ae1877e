# Development and CI entry points. `make test` is what CI runs.

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# Two pytest-xdist workers: the suite waits on servers, subprocesses and
# browsers more than it computes, and each worker starts servers of its own.
PYTEST_WORKERS ?= -n 2
# Only paths that exist (an empty directory is not kept by git).
CODE_PATHS := $(wildcard src tests benchmarks examples)

export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: venv test test-fast lint format typecheck pytest docs docs-serve docs-venv ensure-postgres ensure-redis ensure-java ensure-chromium demo bench dist check-wheel clean

## venv: create .venv and install the package with its dev extras (re-run when pyproject.toml changes)
venv: $(STAMP)

$(STAMP): pyproject.toml
	@if ! $(BIN)/python -m pip --version >/dev/null 2>&1; then \
		echo "Creating $(VENV) with $(PYTHON)"; \
		rm -rf $(VENV); \
		if ! $(PYTHON) -m venv $(VENV); then \
			echo "python3 -m venv failed; installing python3-venv with apt-get"; \
			rm -rf $(VENV); \
			if [ "$$(id -u)" -eq 0 ]; then sudo=; else sudo=sudo; fi; \
			$$sudo env DEBIAN_FRONTEND=noninteractive apt-get update; \
			$$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y python3-venv; \
			$(PYTHON) -m venv $(VENV); \
		fi; \
	fi
	$(BIN)/python -m pip install -e '.[dev]'
	@touch $(STAMP)

## ensure-postgres: install the PostgreSQL server binaries if missing
ensure-postgres:
	scripts/ensure-postgres.sh

## ensure-redis: install Debian's redis-server if missing (the Redis store's tests)
ensure-redis:
	scripts/ensure-redis.sh

## ensure-java: install a Java runtime for Spark if missing
ensure-java:
	scripts/ensure-java.sh

## ensure-chromium: install Debian's chromium and chromedriver if missing (dashboard browser tests)
ensure-chromium:
	scripts/ensure-chromium.sh

## lint: ruff (lint + format check), mypy --strict and the import layers
lint: venv
	$(BIN)/ruff check $(CODE_PATHS)
	$(BIN)/ruff format --check $(CODE_PATHS)
	$(MAKE) --no-print-directory typecheck
	$(BIN)/lint-imports

typecheck: venv
	$(BIN)/mypy --strict src

## format: apply ruff's formatter and autofixes
format: venv
	$(BIN)/ruff format $(CODE_PATHS)
	$(BIN)/ruff check --fix $(CODE_PATHS)

## pytest: the test suite only
pytest: venv ensure-postgres ensure-redis ensure-java ensure-chromium
	$(BIN)/pytest -q $(PYTEST_WORKERS)

## test-fast: the inner loop: SQLite tests only; needs no PostgreSQL, Java or Chromium
test-fast: venv
	CONVEYOR_TEST_FAST=1 $(BIN)/pytest -q -x

## docs: build the documentation site into site/ (a broken link, anchor or reference fails it)
# Its own small environment (the docs extra alone: MkDocs reads the source, it
# does not import it), so a fresh machine builds it in well under a minute; an
# existing dev .venv, which has the docs extra too, is used when present.
# Material for MkDocs prints a notice about its future on every build; it is not about this site.
# Not --quiet: it hides the warnings from the count that --strict fails on.
DOCS_VENV := $(if $(wildcard $(STAMP)),$(VENV),.venv-docs)

docs: docs-venv
	NO_MKDOCS_2_WARNING=1 $(DOCS_VENV)/bin/mkdocs build --strict

## docs-serve: serve the documentation on http://127.0.0.1:8000 (DOCS_ADDR=...), rebuilt as its pages change
DOCS_ADDR ?= 127.0.0.1:8000

docs-serve: docs-venv
	NO_MKDOCS_2_WARNING=1 $(DOCS_VENV)/bin/mkdocs serve --dev-addr $(DOCS_ADDR)

docs-venv:
	@if [ ! -x $(DOCS_VENV)/bin/mkdocs ]; then \
		echo "Creating $(DOCS_VENV) with $(PYTHON)"; \
		$(PYTHON) -m venv $(DOCS_VENV) || { \
			if [ "$$(id -u)" -eq 0 ]; then sudo=; else sudo=sudo; fi; \
			$$sudo env DEBIAN_FRONTEND=noninteractive apt-get update; \
			$$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y python3-venv; \
			rm -rf $(DOCS_VENV); $(PYTHON) -m venv $(DOCS_VENV); }; \
		$(DOCS_VENV)/bin/python -m pip install -q -e '.[docs]'; \
	fi

## dist: build the wheel into dist/
dist: venv
	rm -rf dist
	$(BIN)/python -m pip wheel -q --no-deps -w dist .

## check-wheel: install the wheel with each extra into a fresh environment and import it
check-wheel: dist
	PYTHON=$(PYTHON) scripts/check-wheel.sh

## test: everything CI checks
test: venv ensure-postgres ensure-redis ensure-java ensure-chromium
	$(BIN)/ruff check $(CODE_PATHS)
	$(BIN)/ruff format --check $(CODE_PATHS)
	$(BIN)/mypy --strict src
	$(BIN)/lint-imports
	$(MAKE) --no-print-directory docs
	$(BIN)/pytest -q $(PYTEST_WORKERS)
	$(MAKE) --no-print-directory check-wheel

## demo: run `conveyor demo` (two workers, one killed midway) on ./conveyor-demo.db
# Its own light environment (the cli and web extras: no Spark, no PostgreSQL), so a
# fresh machine is ready in seconds and the dashboard the demo points to starts;
# an existing dev .venv is used when present.
DEMO_VENV := $(if $(wildcard $(STAMP)),$(VENV),.venv-demo)

demo:
	@if [ ! -x $(DEMO_VENV)/bin/conveyor ] || [ ! -x $(DEMO_VENV)/bin/uvicorn ]; then \
		echo "Creating $(DEMO_VENV) with $(PYTHON)"; \
		$(PYTHON) -m venv $(DEMO_VENV) || { \
			if [ "$$(id -u)" -eq 0 ]; then sudo=; else sudo=sudo; fi; \
			$$sudo env DEBIAN_FRONTEND=noninteractive apt-get update; \
			$$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y python3-venv; \
			rm -rf $(DEMO_VENV); $(PYTHON) -m venv $(DEMO_VENV); }; \
		$(DEMO_VENV)/bin/python -m pip install -q -e '.[cli,web]'; \
	fi
	$(DEMO_VENV)/bin/conveyor demo

## bench: run the store benchmark
bench: venv ensure-postgres ensure-redis
	$(BIN)/python benchmarks/store.py

clean:
	rm -rf $(VENV) .venv-demo .venv-docs site .pytest_cache .mypy_cache .ruff_cache .hypothesis build dist src/*.egg-info
