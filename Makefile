# The two commands of the README, plus the pieces they are made of.
.PHONY: sandbox test setup lint unit integration bench

sandbox: setup        ## the local cluster with the three services, until Ctrl-C (SANDBOX_ARGS="--mode second")
	.venv/bin/python -m crane_sandbox $(SANDBOX_ARGS)

test: setup lint      ## everything CI runs: lint, types, unit and integration tests (and the 25 slowest)
	.venv/bin/pytest -q --durations=25

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
