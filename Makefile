# Herald — the one entry point. `make run` and `make test` work on a fresh
# machine with nothing but Python ≥ 3.11 and make: they create .venv themselves.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
CONFIG ?= config.example.toml
# Two workers: the e2e tests mostly wait on daemons and receivers (the 30 slowest
# tests are listed at the end, to keep the suite fast). Tests that
# bounce the shared RabbitMQ stay on one worker (see tests/conftest.py).
PYTEST_ARGS ?= -n 2 --dist loadgroup -rs --durations=30

.PHONY: run test test-fast lint format bench install dev clean services constraints screenshots bytecode

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# Reinstall whenever pyproject.toml changes.
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e .
	touch $@

$(VENV)/.installed-dev: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(VENV)/.installed $@

install: $(VENV)/.installed
dev: $(VENV)/.installed-dev

run: install
	$(BIN)/herald run --config $(CONFIG)

lint: dev
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench
	$(BIN)/mypy

format: dev
	$(BIN)/ruff format src tests bench
	$(BIN)/ruff check --fix src tests bench

services:
	@scripts/test-services.sh

# HERALD_REQUIRE_SERVICES: what `services` provides (promtool, a RabbitMQ node the
# tests may stop) must be there; a test that would skip without it fails instead.
test: lint services bytecode
	HERALD_REQUIRE_SERVICES=1 $(BIN)/pytest $(PYTEST_ARGS)

# Herald's own modules compiled ahead (pip compiles the dependencies it installs, not
# an editable project): the suite starts `herald` some 800 times, and where
# PYTHONDONTWRITEBYTECODE is set nothing caches the compiled modules, so each start
# compiled them all again, a quarter of a CLI command's time.
bytecode: dev
	$(BIN)/python -m compileall -q -j 0 src tests bench

# The lane a developer runs many times a day: lint, the unit tests, and the
# integration tests on SQLite (no PostgreSQL, no brokers, no daemon subprocess).
FAST_PATHS ?= tests/unit $(wildcard tests/integration/test_*.py)
# Property tests try a quarter of their examples here (tests/support/examples.py).
test-fast: lint bytecode
	HERALD_TEST_FAST=1 $(BIN)/pytest -n 2 -q -m "not postgres and not e2e" $(FAST_PATHS)

# The console's screenshots in docs/console/, taken by the browser tests from a seeded database.
screenshots: dev services
	HERALD_SCREENSHOTS=docs/console $(BIN)/pytest -q -p no:randomly tests/e2e/test_console_screenshots.py

bench: dev services
	$(BIN)/python -m bench $(BENCH_ARGS)

# The container image's pinned dependencies; run after changing pyproject.toml's.
constraints:
	PYTHON=$(PYTHON) scripts/constraints.sh

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache build src/*.egg-info
