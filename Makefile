# Kube-Ferry developer entry points. Everything installs into .venv/ and the binary cache
# (~/.cache/kube-ferry, or $FERRY_CACHE_DIR); nothing else on the machine is touched.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
DEMO_DIR ?= .demo

.PHONY: all venv binaries test test-unit test-integration lint typecheck demo demo-down \
        bench-core bench-openb bench-philly bench-scheduler bench-bridge image clean

all: test

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

venv: $(STAMP)

## Build (or reuse) kube-apiserver, controller-manager, scheduler, kubectl, etcd and kwok.
binaries: $(STAMP)
	$(BIN)/ferry binaries

## The full test run: lint, unit and integration tests on real control planes.
test: binaries lint
	$(BIN)/pytest -q -ra

test-unit: $(STAMP)
	$(BIN)/pytest -q -ra -m "not integration"

test-integration: binaries
	$(BIN)/pytest -q -ra -m integration

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy

## Start a compute cluster with 8 GPU nodes and 2 tenant clusters, detached.
demo: binaries
	$(BIN)/ferry up --dir $(DEMO_DIR) --tenants 2 --gpu-nodes 8 --detach
	@echo "try: $(BIN)/kubectl-ferry ... or kubectl --kubeconfig $(DEMO_DIR)/tenant-1.kubeconfig get nodes"

demo-down: $(STAMP)
	$(BIN)/ferry down --dir $(DEMO_DIR)

## Benchmarks (not tests): print figures.
bench-core: $(STAMP)
	$(BIN)/python -m scheduler.bench.core

bench-openb: $(STAMP)
	$(BIN)/python -m scheduler.bench.openb

bench-philly: $(STAMP)
	$(BIN)/python -m scheduler.bench.philly

bench-scheduler: binaries
	$(BIN)/python -m scheduler.bench.service

bench-bridge: binaries
	$(BIN)/python -m vnode.bench

## The container image (OCI layout in build/image/oci), built without a container engine and checked.
image: $(STAMP)
	@command -v mmdebstrap >/dev/null && command -v umoci >/dev/null || apt-get install -y --no-install-recommends mmdebstrap umoci
	$(BIN)/python -m ferry.image

clean:
	rm -rf $(VENV) $(DEMO_DIR) .pytest_cache .mypy_cache .ruff_cache
