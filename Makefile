# The two commands of the README: `make demo` and `make test`. Both work on a bare
# Debian machine as root: they install what is missing, then run.
SHELL := /bin/bash
PY ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
APT_PACKAGES := zookeeper redis-server default-jre-headless

.PHONY: demo test deps venv lint typecheck unit chaos bench clean

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	@touch $(STAMP)

venv: $(STAMP)

# ZooKeeper and Redis servers for the integration tests, Java for Spark and ZooKeeper.
deps:
	@if [ -f /usr/share/java/zookeeper.jar ] && command -v redis-server >/dev/null && command -v java >/dev/null; then \
		echo "system packages present: $(APT_PACKAGES)"; \
	else \
		apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q $(APT_PACKAGES); \
	fi

demo: venv
	$(BIN)/python -m examples.tweets run --until-drained

lint: venv
	$(BIN)/ruff check transactional coordinators committers examples tests benchmarks
	$(BIN)/ruff format --check transactional coordinators committers examples tests benchmarks

typecheck: venv
	$(BIN)/mypy

unit: venv
	$(BIN)/pytest -q tests/unit

test: deps venv lint typecheck
	$(BIN)/pytest -q -ra

# A longer randomized fault campaign (SIGKILLs, Redis restarts, injected exceptions,
# bad records) on both sinks; not part of `make test`. CHAOS="--quick" for a short one,
# CHAOS="--zookeeper" to keep the state in ZooKeeper and restart it too.
chaos: deps venv
	$(BIN)/python -m tests.chaos $(CHAOS)

# Throughput against Structured Streaming and a bare Spark job; writes benchmarks/RESULTS.md.
# BENCH="--quick" for 100k tweets and one repetition.
bench: deps venv
	$(BIN)/python -m benchmarks.bench $(BENCH)

clean:
	rm -rf .transactional .pytest_cache .mypy_cache .ruff_cache
