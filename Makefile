# Warden's one task runner. `make help` lists the targets.
.DEFAULT_GOAL := help
SHELL := /bin/bash

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PY := $(BIN)/python
STAMP := $(VENV)/.installed-stamp
PROTOS := $(wildcard proto/warden/v1/*.proto)
PLUGINS := --plugin=protoc-gen-mypy=$(BIN)/protoc-gen-mypy --plugin=protoc-gen-mypy_grpc=$(BIN)/protoc-gen-mypy_grpc
TS := client/typescript
NPM_STAMP := $(TS)/node_modules/.installed-stamp
BUF := $(TS)/node_modules/.bin/buf

$(NPM_STAMP): $(TS)/package-lock.json
	cd $(TS) && npm ci --no-audit --no-fund
	touch $(NPM_STAMP)

# Both distributions, editable: the SDK (client/, `warden`) and the plane with
# the development tools (`warden-server[dev]`, which depends on the SDK).
# uv installs them, downloading in parallel: the whole step takes about 16 s
# on a fresh clone with no download cache, against 27 s with pip, and every
# `make test` and `make run` on a new machine waits for it. pip installs uv
# itself, pinned, so that its options hold. Like pip, it compiles the
# bytecode as it installs (else every process of the suite compiles its
# imports where bytecode is not written), and it trusts the system's
# certificate store rather than a bundle of its own. It also brings .venv's
# pip up to date, as before: the SDK-alone install test runs that pip.
UV := $(BIN)/uv pip install --quiet --system-certs --compile-bytecode --python $(PY)
$(STAMP): pyproject.toml client/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet uv==0.13.9
	$(UV) --upgrade-package pip pip -e ./client -e '.[dev]'
	touch $(STAMP)

.PHONY: help
help: ## Show this help
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*## "} {printf "  make %-12s %s\n", $$1, $$2}'

.PHONY: install
install: $(STAMP) ## Create .venv with the SDK and the plane (editable) and the development tools

.PHONY: run
run: $(STAMP) ## Serve the plane on 127.0.0.1:50051 with policies/ and var/warden.db
	$(BIN)/warden serve --config warden.toml

# The store contract suite and the replica tests start a throw-away PostgreSQL
# server (tests/postgres.py) from Debian's postgresql package, whose binaries
# live in /usr/lib/postgresql/N/bin, off the PATH: in CI (CI=true, 1 or yes, as
# tests/postgres.py reads it) it is installed when missing, and a skipped
# PostgreSQL test fails the run.
.PHONY: postgres-binaries
postgres-binaries: ## Install Debian's PostgreSQL server binaries for the tests, when missing (in CI)
	@if ! command -v initdb >/dev/null && ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then \
	  if case "$${CI:-}" in true|TRUE|True|1|yes|YES|Yes) true;; *) false;; esac; then \
	    SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo); \
	    $$SUDO apt-get update -qq && $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends postgresql; \
	  else \
	    echo "no PostgreSQL server binaries: the PostgreSQL tests skip (apt-get install postgresql)"; \
	  fi; \
	fi

# The suite runs in one session. WARDEN_TEST_PROCESSES=1,2 runs each
# integration and console test whose planes take their process count from it
# twice, as variants [1proc] and [2proc] (tests/conftest.py); two sessions, one
# per count, cost a second collection by every worker, about 14 s.
#
# Test workers: more than the cores, since most tests wait on planes they
# start (2 cores: 4 workers beat 2 and 6). An idle worker steals queued tests
# from a busy one (worksteal): xdist's default deals tests out in advance and
# cannot take them back, so the first pass ended on one worker's long queue,
# 171 s against 144 s.
TEST_WORKERS ?= 4
PYTEST := $(BIN)/pytest -q -n $(TEST_WORKERS) --dist worksteal

# make test runs the suite and, beside it, the checks (three at a time): the
# checks are mostly one process each (mypy, tsc, buf, npm ci waiting on the
# registry) and fill the time the suite's workers spend waiting on their
# planes. On a fresh clone: 279-281 s in all, against 293 s with the checks
# first. A failing check fails make test once the suite has run.
# On a fresh machine the virtual environment, node_modules and the Debian
# packages install side by side too.
.PHONY: test
test: ## Lint, type-check, check generated code, run every test
	@$(MAKE) --no-print-directory -j 4 --output-sync=line suite checks

.PHONY: suite
# node_modules is installed before the suite starts: the TypeScript tests
# install it themselves only when run without make, never beside the checks
# that use it.
suite: $(STAMP) $(NPM_STAMP) test-packages ## The test suite alone (make test runs it beside the checks)
	WARDEN_TEST_PROCESSES=1,2 $(PYTEST)

# The Debian packages the suite needs, one apt-get after the other: apt lets
# one run at a time.
.PHONY: test-packages
test-packages:
	@$(MAKE) --no-print-directory postgres-binaries
	@$(MAKE) --no-print-directory chromium

.PHONY: checks
checks: lint typecheck proto-check proto-ts-check buf-lint buf-breaking ts-test policy-check ## Every check that is not the test suite

.PHONY: policy-check
policy-check: $(STAMP) ## The example policies: they load, and their tests pass with full coverage
	$(BIN)/warden policy check policies
	$(BIN)/warden policy test policies --min-coverage 100

# Chromium's headless shell, not the whole browser: the tests run it headless
# and without its sandbox, and the shell is what Playwright itself launches
# for headless runs. The console's tests took about 17 s of Chromium's CPU
# with it against 52 s with the browser (whose main process alone took 20 s,
# and each page's renderer about 1 s), and its package is 64 MB against 81
# MB, with fewer libraries beside it (no GTK, CUPS or Cairo). Without the
# packages Debian recommends: the tests need only the shell and a font.
CHROMIUM := /usr/bin/chromium-headless-shell
CHROMIUM_INSTALL := env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium-headless-shell fonts-liberation

.PHONY: chromium
chromium: ## Install Debian's Chromium headless shell for the console's browser tests, when it is missing
	@test -x $(CHROMIUM) || { \
		if [ "$$(id -u)" = 0 ]; then $(CHROMIUM_INSTALL) || { apt-get update && $(CHROMIUM_INSTALL); }; \
		elif [ "$$CI" = true ]; then sudo $(CHROMIUM_INSTALL) || { sudo apt-get update && sudo $(CHROMIUM_INSTALL); }; \
		else echo "the console's browser tests need Debian's Chromium headless shell: sudo apt-get install chromium-headless-shell"; exit 1; fi; }

.PHONY: lint
lint: $(STAMP) ## ruff check and ruff format --check
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

.PHONY: format
format: $(STAMP) ## Apply ruff's fixes and formatting
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

.PHONY: typecheck
typecheck: $(STAMP) ## mypy over the SDK, the plane and the benchmarks
	$(BIN)/mypy

.PHONY: proto
proto: $(STAMP) ## Regenerate client/warden/v1 and docs/reference/errors.md from proto/
	$(PY) -m grpc_tools.protoc -I proto $(PLUGINS) --python_out=client --grpc_python_out=client \
		--mypy_out=client --mypy_grpc_out=client $(PROTOS)
	$(PY) -m warden_server.docs_gen > docs/reference/errors.md

.PHONY: schemas
schemas: $(STAMP) ## Regenerate schemas/ (JSON Schema of policy and test files) from the models
	$(BIN)/warden policy schema > schemas/policy.schema.json
	$(BIN)/warden policy schema --tests > schemas/policy-tests.schema.json

.PHONY: proto-check
proto-check: $(STAMP) ## Fail if the generated code or errors.md differ from proto/
	@tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	$(PY) -m grpc_tools.protoc -I proto $(PLUGINS) --python_out=$$tmp --grpc_python_out=$$tmp \
		--mypy_out=$$tmp --mypy_grpc_out=$$tmp $(PROTOS) && \
	for f in $$tmp/warden/v1/*; do \
		diff -u "client/warden/v1/$$(basename $$f)" "$$f" >/dev/null || \
		{ echo "generated code is stale: client/warden/v1/$$(basename $$f) (run make proto)"; exit 1; }; \
	done; \
	$(PY) -m warden_server.docs_gen | diff -u docs/reference/errors.md - >/dev/null || \
		{ echo "docs/reference/errors.md is stale (run make proto)"; exit 1; }; \
	echo "generated code and docs match proto/"

.PHONY: proto-ts
proto-ts: $(NPM_STAMP) ## Regenerate client/typescript/src/gen from proto/ (buf.gen.yaml)
	$(BUF) generate

.PHONY: proto-ts-check
proto-ts-check: $(NPM_STAMP) ## Fail if client/typescript/src/gen differs from proto/
	@tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	$(BUF) generate -o "$$tmp" && \
	diff -r "$(TS)/src/gen" "$$tmp/$(TS)/src/gen" >/dev/null || \
		{ echo "generated code is stale: $(TS)/src/gen (run make proto-ts)"; exit 1; }; \
	echo "generated TypeScript matches proto/"

.PHONY: buf-lint
buf-lint: $(NPM_STAMP) ## Lint proto/ with buf (the rules and their exceptions are in buf.yaml)
	$(BUF) lint

.PHONY: buf-breaking
buf-breaking: $(NPM_STAMP) ## Fail on a breaking change to proto/ since the released contract
	$(BUF) breaking --against proto/baseline.binpb

.PHONY: proto-baseline
proto-baseline: $(NPM_STAMP) ## At a release: record proto/ as the contract buf-breaking compares with
	$(BUF) build --exclude-source-info -o proto/baseline.binpb

.PHONY: ts-test
# Its build writes dist/ as the integration tests' build does, beside it in
# make test: both take client/typescript/.build.lock, so one tsc writes at a
# time and the second finds nothing left to emit.
ts-test: $(NPM_STAMP) ## The TypeScript SDK: biome, then its tests, whose build is tsc (strict)
	cd $(TS) && npm run --silent lint && flock .build.lock npm test --silent

.PHONY: bench
bench: $(STAMP) ## Run the benchmarks (BENCH="--quick sdk" to choose); figures in var/bench/
	$(PY) -m benchmarks $(BENCH)

.PHONY: clean
clean: ## Remove the virtual environment, caches and var/
	rm -rf $(VENV) var .mypy_cache .ruff_cache .pytest_cache .hypothesis
