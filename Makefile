# The two commands of the README, plus the pieces they are made of.
.PHONY: sandbox test test-oldest setup lint unit integration bench

sandbox: setup        ## the local cluster with the four services, until Ctrl-C (SANDBOX_ARGS="--mode second")
	.venv/bin/python -m crane_sandbox $(SANDBOX_ARGS)

# CI's order (docs/ci.md): the Kubernetes build runs in the background (setup --ci) while lint and the tests that
# need no Go-built binary run; the first test that needs one waits on its build's lock. One pytest run: one summary,
# in TEST_WORKERS processes (pytest-xdist; whole modules per worker): most of the suite waits on servers, so two
# workers share 2 cores (docs/ci.md). TEST_WORKERS=0: everything in pytest's own process.
# CRANE_NO_PREFETCH: setup has queued every build in CI's order; the test modules' own prefetches would start the
# later ones at once, beside the Kubernetes build.
TEST_WORKERS ?= 2
test:                 ## everything CI runs: lint, types, unit and integration tests (and the 25 slowest)
	@scripts/setup --ci
	@$(MAKE) --no-print-directory lint
	CRANE_NO_PREFETCH=1 .venv/bin/pytest -q --durations=25 -n $(TEST_WORKERS)

# The oldest supported Kubernetes release (1.35) under a lean set of the integration tests whose behaviour depends
# on what the API server serves (docs/ci.md, "Supported Kubernetes releases"). Not in CI: its servers are a second
# Kubernetes build (built here on first use, cached like the newest's).
OLDEST_TESTS = tests/integration/test_kube_contract.py tests/integration/scheduler/test_gangs.py \
	tests/integration/scheduler/test_dra.py tests/integration/scheduler/test_placement.py \
	tests/integration/extender/test_kube_scheduler.py
test-oldest: setup    ## the lean suite on Kubernetes 1.35's servers and kube-scheduler (CRANE_KUBE_RELEASE=1.35)
	CRANE_KUBE_RELEASE=1.35 .venv/bin/pytest -q $(OLDEST_TESTS)

setup:
	@scripts/setup

lint:
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	.venv/bin/mypy

unit: setup
	.venv/bin/pytest -q tests/unit

integration: setup
	.venv/bin/pytest -q tests/integration

bench: setup
	.venv/bin/python -m bench
