# netai-testbed: the commands the README gives.
#   make setup        OS packages, Open vSwitch daemons, the venv (idempotent)
#   make test         setup, then ruff, mypy, the docs site and pytest (unit, integration, docker): scripts/test.sh
#   make docs         the documentation site from docs/ into site/ (mkdocs, strict, offline)
#   sudo make experiment   setup, then the quick experiment (experiments/quick.yaml)
#   make clean        remove what a crashed run left (Mininet, OVS bridges, containers)

VENV ?= .venv
PY := $(VENV)/bin/python
NETAI := $(VENV)/bin/netai
PYTEST_ARGS ?=
CONFIG ?= experiments/quick.yaml

.PHONY: setup test lint typecheck docs unit integration experiment clean benchmark

setup:
	bash scripts/provision.sh

lint:
	$(VENV)/bin/ruff check .

typecheck:
	$(VENV)/bin/mypy

# Strict: a warning (a broken link or anchor, a page left out of the nav, an API reference that
# does not resolve) fails the build. Nothing is fetched.
docs:
	$(VENV)/bin/mkdocs build --strict --quiet --site-dir site

test:
	VENV=$(VENV) PYTEST_ARGS="$(PYTEST_ARGS)" bash scripts/test.sh

unit:
	$(PY) -m pytest tests/unit $(PYTEST_ARGS)

experiment: setup
	$(NETAI) experiment $(CONFIG)

benchmark:
	$(PY) benchmarks/bench_scheduling.py
	$(PY) benchmarks/bench_joint.py
	$(PY) benchmarks/bench_ilp.py
	$(PY) benchmarks/bench_selection.py
	flock /tmp/netai-mininet.lock $(PY) benchmarks/bench_transfer.py
	flock /tmp/netai-mininet.lock $(PY) benchmarks/bench_dataplane.py
	flock /tmp/netai-mininet.lock $(PY) benchmarks/bench_servers.py
	$(PY) benchmarks/bench_server_start.py
	$(PY) benchmarks/bench_controller_start.py
	flock /tmp/netai-mininet.lock $(PY) benchmarks/bench_figures.py
	$(PY) benchmarks/bench_warmup.py
	$(PY) benchmarks/bench_site_memory.py
	flock /tmp/netai-mininet.lock $(PY) benchmarks/bench_faults.py
	flock /tmp/netai-mininet.lock $(PY) benchmarks/bench_hop.py
	flock /tmp/netai-mininet.lock $(PY) benchmarks/bench_shaping.py
	flock /tmp/netai-mininet.lock $(PY) benchmarks/bench_datapath.py --quick
	$(PY) benchmarks/bench_train_concurrency.py
	flock /tmp/netai-mininet.lock $(PY) benchmarks/bench_cluster.py
	flock /tmp/netai-mininet.lock $(PY) benchmarks/bench_bringup.py
	$(PY) benchmarks/bench_simulation.py

clean:
	@if [ -x $(NETAI) ]; then $(NETAI) clean; else bash scripts/clean.sh; fi
