# Kube-Ferry developer entry points. Everything installs into .venv/ and the binary cache
# (~/.cache/kube-ferry, or $FERRY_CACHE_DIR); nothing else on the machine is touched.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
DEMO_DIR ?= .demo

.PHONY: all venv binaries test test-clients test-unit test-integration test-faults soak overload lint typecheck demo demo-down down e2e e2e-kind \
        bench bench-core bench-openb bench-philly bench-philly-heldout bench-philly-jitter bench-philly-groupings bench-synthetic bench-consolidation bench-scheduler bench-bridge bench-dns bench-replay image clean

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

## The full test run: lint, unit and integration tests on real control planes (the 15 slowest listed).
## TEST_WORKERS pytest processes share the files out, each with control planes of its own: the run mostly
## waits on timers (grace periods, kwok's pod durations, watch back-offs), so two overlap those waits.
TEST_WORKERS ?= 2
test: test-clients lint
	$(BIN)/pytest -q -ra --durations=15 -n $(TEST_WORKERS) --dist loadfile

## The operators the integration tests run as tenant clients, built before the tests so that a cold cache
## costs build time once instead of a test's timeout (`--clients` ensures the control-plane binaries too).
test-clients: $(STAMP)
	$(BIN)/ferry binaries --clients

test-unit: $(STAMP)
	$(BIN)/pytest -q -ra -m "not integration"

test-integration: binaries
	$(BIN)/pytest -q -ra -m integration

## The fault tests alone (also part of `make test`): kill -9 of a vnode mid-burst, a 60 s compute outage,
## a leader dying, the scheduler killed mid-gang, bounded shutdowns under load.
test-faults: binaries
	$(BIN)/pytest -q -ra -m faults

## The chaos soak (not in `make test`): 15 min of jobs on 2 tenants × 64 GPU nodes with a random kill -9
## every 30–90 s (vnode, scheduler leader, tenant/compute apiserver, etcd); prints the audit and exits 1 if
## anything is duplicated, lost, orphaned, half bound, miscounted, or a daemon's memory grew > 10 %.
soak: binaries
	$(BIN)/python -m tests.soak $(SOAK_ARGS)

## Overload (not in `make test`): one tenant creates 5,000 pods at once; the other's p99 create→Running
## must stay within 2× of its unloaded value.
overload: binaries
	$(BIN)/python -m tests.overload $(OVERLOAD_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy

## Start a compute cluster (32 GPU nodes) and 2 tenant clusters unless they run, then play the scenario
## (live view; the clusters stay up for exploring; `make down` stops them).
demo: binaries
	$(BIN)/ferry demo --dir $(DEMO_DIR) --start

demo-down down: $(STAMP)
	$(BIN)/ferry down --dir $(DEMO_DIR)

## The end-to-end suite (e2e/): on local control planes it starts itself, or on yours with
## FERRY_E2E_COMPUTE / FERRY_E2E_TENANTS; e2e-kind installs the image and manifests on kind clusters.
e2e: binaries
	$(BIN)/pytest -q -ra e2e

e2e-kind: $(STAMP)
	PY=$(CURDIR)/$(BIN)/python e2e/kind/run.sh

## Benchmarks (not tests): print figures. `make bench` is Kube-Ferry beside Volcano and kube-scheduler
## (builds vc-scheduler; report in results/bench-<time>/).
bench: binaries
	$(BIN)/python -m bench

## Benchmarks of one part each.
bench-core: $(STAMP)
	$(BIN)/python -m scheduler.bench.core

bench-openb: $(STAMP)
	$(BIN)/python -m scheduler.bench.openb

bench-philly: $(STAMP)
	$(BIN)/python -m scheduler.bench.philly

# The same checks on slices no rule was shaped on (other sizes, windows of other days): ~9 min on 2 cores.
bench-philly-heldout: $(STAMP)
	$(BIN)/python -m scheduler.bench.philly --held-out

# The matrix's cells (ferry, volcano preset) on the trace and 3 copies with durations jittered by up to a
# second: the spread one replay's course makes (~30 min on 2 cores).
bench-philly-jitter: $(STAMP)
	$(BIN)/python -m scheduler.bench.philly --jitter 3

# The departments at the headline, VCs grouped largest first and in 8 random orders, each against flat
# queues: how much of their cost is the grouping's (~16 min on 2 cores).
bench-philly-groupings: $(STAMP)
	$(BIN)/python -m scheduler.bench.philly --groupings 8

# The ferry and volcano presets on synthetic workloads no rule was shaped on (12 seeds x 3 loads, the
# matrix's checks on each; ~3-5 min on 2 cores).
bench-synthetic: $(STAMP)
	$(BIN)/python -m scheduler.bench.synthetic

bench-consolidation: $(STAMP)
	$(BIN)/python -m scheduler.bench.consolidation

bench-scheduler: binaries
	$(BIN)/python -m scheduler.bench.service

bench-bridge: binaries
	$(BIN)/python -m vnode.bench

# `ferry dns` beside CoreDNS (built from its Go module) in the same run: answers from its index, and what
# relaying the rest costs (~1 min, plus CoreDNS's first build).
bench-dns: $(STAMP)
	$(BIN)/python -m vnode.dnsbench

## The trace replay of `make bench` alone: Philly jobs through Kube-Ferry and Volcano on real control planes.
bench-replay: binaries
	$(BIN)/python -m bench --only replay

## The container image (OCI layout in build/image/oci), built without a container engine and checked.
image: $(STAMP)
	@command -v mmdebstrap >/dev/null && command -v umoci >/dev/null || apt-get install -y --no-install-recommends mmdebstrap umoci
	$(BIN)/python -m ferry.image

clean:
	rm -rf $(VENV) $(DEMO_DIR) .pytest_cache .mypy_cache .ruff_cache
