# The two commands a new user needs: `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test test-unit test-integration test-slow bench install clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

## run: start an embedded Valkey (or use REDIS_URL), the worker pool, and a scripted delegation tree
run: $(STAMP)
	$(BIN)/treemail demo

## test: the whole suite, slow fault tests included; starts its own Valkey
test: $(STAMP)
	$(BIN)/pytest -q

test-unit: $(STAMP)
	$(BIN)/pytest -q tests/unit

test-integration: $(STAMP)
	$(BIN)/pytest -q tests/integration

test-slow: $(STAMP)
	$(BIN)/pytest -q -m slow

## bench: throughput and latency next to raw baselines measured in the same run
bench: $(STAMP)
	$(BIN)/python -m bench.run

clean:
	rm -rf $(VENV) build *.egg-info
