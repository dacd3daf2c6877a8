# The two commands of the README (and `make docs`, the site): `make demo` and `make test`. Both work on a bare
# Debian machine as root: they install what is missing, then run.
SHELL := /bin/bash
PY ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DOCS_STAMP := $(VENV)/.docs-installed
APT_PACKAGES := zookeeper redis-server default-jre-headless openssl

.PHONY: demo test test-slow test-soak cluster-test connect-test connect-test-full test-exhaustive test-bounds connect-client-test lock deps java venv lint typecheck unit chaos mutation soak bench docs clean

# PYTHONWARNINGS reaches pip's build backend: setuptools' notes on editable installs are
# for packagers, not for someone running the demo.
# The versions are constraints.txt's: the one set CI runs (`make lock` writes it).
$(STAMP): pyproject.toml constraints.txt
	@echo "installing the project and its dependencies into $(VENV) (first run: a few minutes)"
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	@PYTHONWARNINGS=ignore $(BIN)/pip install -q --upgrade pip
	@PYTHONWARNINGS=ignore $(BIN)/pip install -q -c constraints.txt --config-settings editable_mode=compat -e '.[spark,delta,lineage,dev]'
	@touch $(STAMP)

venv: $(STAMP)

$(DOCS_STAMP): pyproject.toml constraints.txt $(STAMP)
	@PYTHONWARNINGS=ignore $(BIN)/pip install -q -c constraints.txt --config-settings editable_mode=compat -e '.[spark,delta,lineage,dev,docs]'
	@touch $(DOCS_STAMP)

# ZooKeeper and Redis servers for the integration tests, Java for Spark and ZooKeeper,
# openssl for the certificates of the Redis TLS test.
deps:
	@if [ -f /usr/share/java/zookeeper.jar ] && command -v redis-server >/dev/null && command -v java >/dev/null && command -v openssl >/dev/null; then \
		echo "system packages present: $(APT_PACKAGES)"; \
	else \
		apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q $(APT_PACKAGES); \
	fi

# Spark needs Java; the demo needs nothing else from the system.
java:
	@command -v java >/dev/null || { echo "installing Java (apt-get, first run)"; \
		apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive \
		apt-get install -y -q default-jre-headless >/dev/null; }

demo: java venv
	@$(BIN)/python -m examples.tweets run --until-drained

lint: venv
	$(BIN)/ruff check transactional coordinators committers examples tests benchmarks .ci
	$(BIN)/ruff format --check transactional coordinators committers examples tests benchmarks .ci

typecheck: venv
	$(BIN)/mypy

unit: venv
	$(BIN)/pytest -q tests/unit

# TEST_WORKERS=2 runs the files on two pytest-xdist workers, each a file at a time
# with its own servers and Spark session (a file's tests share module-scoped ones,
# hence loadfile): 28 min against 33 serially on 2 cores. Serial by default: of three
# two-worker runs, two each failed a test that passes serially (a Kafka test talking
# to the other worker's broker, since fixed; a checkpoint left unreleased under load).
TEST_WORKERS ?= 0

# Rotated runs (tests/rotation.py): in `make test-slow` the crash chains kill after a
# group's sink write and at a third of the protocol's other steps each, every step still
# killed in every run across the chains; in `make connect-test` each test, and in `make
# test` and `make test-slow` each test marked rotated, runs half of its parametrized
# variations. The part moves on with the seed, which ROTATION sets: auto (the number in
# .ci/seed, one more at each submission to CI, printed at the end), a number (that run's
# selection again) or all (every cell).
ROTATION ?= auto

test: deps venv lint typecheck
	$(BIN)/pytest -q -ra --durations=15 -m "not slow and not cluster" -n $(TEST_WORKERS) --dist loadfile --rotation $(ROTATION)


# The longest suites (the SIGKILL crash matrices of the three guarantees, user topologies
# crashed and rerun through `transactional run`, snapshots against a running writer, three
# planted bugs each caught by its test (tests/mutation/test_planted.py):
# 28 to 41 min in CI's lanes on 2 cores, rotated, by seed); CI runs it, then `make
# cluster-test` and `make test-bounds BOUNDS=--short`, beside `make test`, `make
# connect-test`, `make connect-client-test` and `make test-soak`. Each
# suite prints its 15 slowest tests, so a CI log says where its time went.
test-slow: deps venv
	$(BIN)/pytest -q -ra --durations=15 -m "slow and not cluster and not soak" --rotation $(ROTATION)

# The short soak (tests/e2e/test_soak.py: `python -m tests.soak --quick`, 200 txids with
# ZooKeeper and Redis restarted and exceptions injected, exact and flat; 5 min beside
# another suite), apart from `make test-slow`: CI runs it last in the lane of `make test`.
test-soak: deps venv
	$(BIN)/pytest -q -ra -m soak

# The rest of the cases of kinds CI runs (marked exhaustive: the remaining value types
# and modes of the aggregate states on Delta, the crash and rerun of a user's topology
# over Parquet files and a local Delta table): all of them, on demand; CI runs a fifth of
# them a run (in `make test-slow`, rotated: each within five consecutive CI runs).
test-exhaustive: deps venv
	$(BIN)/pytest -q -ra --durations=15 -m "exhaustive and not cluster"

# The tests marked connect on a Spark Connect session, against a server the suite starts
# (pytest --connect: a process is either Connect's or classic, so they run apart from
# `make test`); CI runs it after `make test`. It is rotated (ROTATION above): of the
# cases marked connect_full, variations whose Connect path another case covers (a commit
# mode, a value type, a second Kafka crash), a fifth a run; of each other test, half of
# its variations. `make connect-test-full` runs them all. The crash matrix's Connect
# chains are in `make test-slow`.
connect-test: deps venv
	$(BIN)/pytest -q -ra --durations=15 --connect -m "not slow and not cluster" --rotation $(ROTATION)

connect-test-full: deps venv
	$(BIN)/pytest -q -ra --durations=15 --connect -m "not slow and not cluster"

# A Spark standalone master and workers, a three-server ZooKeeper ensemble and a Redis
# Cluster (three masters, a replica each), on loopback, started by the tests from the
# installed packages; rotated (the short chaos campaign's spout kind, and the spout kind the
# cluster runs the demo with). CI runs it after `make test-slow`, beside `make
# connect-test`, `make connect-client-test` and `make test-soak`.
cluster-test: deps venv
	$(BIN)/pytest -q -ra --durations=15 -m cluster --rotation $(ROTATION)

# The fault campaign at scale (python -m tests.chaos): ZooKeeper, a Redis Cluster and a
# Spark standalone cluster on loopback, every spout kind, both sinks, SIGKILLs at every
# protocol step, ZooKeeper session expiries and restarts, Redis failovers and restarts,
# Spark worker kills, injected exceptions and bad records, checked record by record;
# about an hour on 2 cores; not part of `make test` (`make cluster-test` runs a short one).
# The full run writes its tables to tests/CHAOS.md, with the commit it ran at;
# CHAOS="--quick" for a short one, which writes nothing. Then live runners in
# contention (python -m tests.contention, tests/contention.py): six contests of two or
# three runners of one topology, six leaders deposed in each (frozen, cut off from
# ZooKeeper, session expired), Delta local and in S3, about 25 min; its table goes to
# tests/CONTENTION.md; CONTENTION="--contests 1 --rounds 3" for a short one.
chaos: deps venv
	$(BIN)/python -m tests.chaos $(if $(CHAOS),$(CHAOS),--markdown tests/CHAOS.md)
	$(BIN)/python -m tests.contention $(if $(CONTENTION),$(CONTENTION),--markdown tests/CONTENTION.md)

# The suites' core at the lower end of every range pyproject.toml declares (.ci/venvs.py):
# .venv-lowest made with the project's requirements at their lowest allowed versions (the
# tests' tools as constraints.txt pins them); the unit tests, both sinks' contracts, the
# ledger, the state stores, the Kafka source, the demo and a crash chain run from it.
# BOUNDS="--short" for the shorter set CI runs (the unit tests, both sinks' contracts, the
# ledger, lineage and a killed demo run resumed).
test-bounds: deps java venv
	$(BIN)/python .ci/venvs.py lowest $(BOUNDS)

# The Connect-only install (.ci/venvs.py): .venv-client with PySpark's Connect client
# alone (the connect extra: no JVM, no PySpark distribution); Connect tests run from it
# against a server that .venv's install starts, rotated as `make connect-test` is. CI runs
# it after `make connect-test`, which there leaves its files out (`.ci/venvs.py client
# --ignores`): they run once, from the Connect-only install.
connect-client-test: deps java venv
	$(BIN)/python .ci/venvs.py client --rotation $(ROTATION)

# constraints.txt again from pyproject.toml's ranges (.ci/lock.py): the versions it pins
# kept where they still fit; UPGRADE=1 for the newest the ranges allow.
lock: venv
	$(BIN)/python .ci/lock.py $(if $(UPGRADE),--upgrade)

# Planted bugs (python -m tests.mutation, tests/mutation/bugs.py): each of a dozen
# plausible protocol bugs patched into the product at run time from the tests, its
# crash chains, campaign or ledger tests run until one fails; writes tests/MUTATION.md
# (what caught each bug, after how many demo runs and kills) with the commit it ran at,
# and fails when a bug went uncaught. BUGS="name ..." for some of them (their table is
# printed, not written).
mutation: deps venv
	$(BIN)/python -m tests.mutation $(BUGS)

# The soak (python -m tests.soak): 10,000 txids of three tweets on both sinks with the
# state in ZooKeeper, ZooKeeper and Redis restarted in turn every 5 min and exceptions
# injected throughout; exact on both sinks, and the driver's memory, its JVM's live
# heap, threads and open files and the store's nodes flat after the warm-up. About two
# hours on 2 cores; writes tests/SOAK.md with the commit it ran at. SOAK="--quick" for a short one (make test-slow
# runs it), which writes nothing.
soak: deps venv
	$(BIN)/python -m tests.soak $(if $(SOAK),$(SOAK),--markdown tests/SOAK.md)

# Throughput against Structured Streaming and a bare Spark job; writes benchmarks/RESULTS.md.
# BENCH="--quick" for 100k tweets and one repetition.
bench: deps venv
	$(BIN)/python -m benchmarks.bench $(BENCH)

# The documentation site (mkdocs.yml, the pages in docs/, the API from the docstrings) into
# site/: open site/index.html. Strict: a broken link or anchor, a page left out of the
# navigation or an API reference that does not resolve fails the build; CI runs it.
docs: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

clean:
	rm -rf .transactional .pytest_cache .mypy_cache .ruff_cache site
