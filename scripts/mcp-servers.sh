#!/usr/bin/env bash
# Install the real MCP servers that tests/mcp runs against, into the cache outside the repository.
#
# They are the MCP project's reference servers, written by others, pinned here:
#   - mcp-server-time and mcp-server-git (PyPI), in their own virtual environment:
#     $LOOPDEV_CACHE_DIR/mcp/python (commands in its bin/);
#   - @modelcontextprotocol/server-filesystem and @modelcontextprotocol/server-everything (npm,
#     run by the system's Node): $LOOPDEV_CACHE_DIR/mcp/node (commands in node_modules/.bin/).
# Nothing is downloaded at run time: a second run finds them and does nothing.
#
# Usage: scripts/mcp-servers.sh [--print-dir]
set -euo pipefail

PYTHON_SERVERS=("mcp-server-time==2026.10.19" "mcp-server-git==2026.10.19")
NODE_SERVERS=("@modelcontextprotocol/server-filesystem@2026.8.31"
    "@modelcontextprotocol/server-everything@2026.8.31")

cache="${LOOPDEV_CACHE_DIR:-$HOME/.cache/loopd}"
dir="$cache/mcp"
python="${PYTHON:-python3}"
stamp_python="$dir/python/.installed-$(printf '%s\n' "${PYTHON_SERVERS[@]}" | sha256sum | cut -c1-12)"
stamp_node="$dir/node/.installed-$(printf '%s\n' "${NODE_SERVERS[@]}" | sha256sum | cut -c1-12)"

log() { printf 'mcp-servers: %s\n' "$*" >&2; }

if [ "${1:-}" = "--print-dir" ]; then
    echo "$dir"
    exit 0
fi

install_python() {
    if [ -f "$stamp_python" ] && "$dir/python/bin/mcp-server-time" --help >/dev/null 2>&1; then
        log "Python servers already installed in $dir/python"
        return
    fi
    rm -rf "$dir/python"
    log "installing ${PYTHON_SERVERS[*]} into $dir/python"
    # The interpreter itself, not a venv's: the servers' environment must not depend on loopd's.
    base=$("$python" -c 'import sys; print(sys.base_prefix)')
    "$base/bin/python3" -m venv "$dir/python"
    "$dir/python/bin/pip" install --quiet --disable-pip-version-check "${PYTHON_SERVERS[@]}"
    touch "$stamp_python"
}

install_node() {
    if [ -f "$stamp_node" ] && [ -x "$dir/node/node_modules/.bin/mcp-server-filesystem" ]; then
        log "Node servers already installed in $dir/node"
        return
    fi
    command -v npm >/dev/null 2>&1 || { log "npm not found (Debian packages nodejs and npm)"; exit 1; }
    rm -rf "$dir/node"
    mkdir -p "$dir/node"
    log "installing ${NODE_SERVERS[*]} into $dir/node"
    (cd "$dir/node" && npm install --silent --no-audit --no-fund --no-save --prefix . \
        "${NODE_SERVERS[@]}" >/dev/null)
    touch "$stamp_node"
}

mkdir -p "$dir"
install_python
install_node
