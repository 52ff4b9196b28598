#!/usr/bin/env bash
# `make verify-device`: the self-test against the server loopd will use.
#   LOOPD_INFER_URL set: check that server (your deployment), for LOOPD_MODEL.
#   unset: start the embedded real llama-server and check both of its models.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=.venv/bin
if [ -n "${LOOPD_INFER_URL:-}" ]; then
    exec $bin/loopd selftest "$@"
fi
run=state/verify-device
mkdir -p "$run"
$bin/python -m loopd_dev.devserver --socket "$run/llama.sock" --workdir "$run/devserver" \
    >"$run/llama-server.log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null || true; wait $server 2>/dev/null || true' EXIT
for _ in $(seq 1 600); do
    grep -q "ready at" "$run/llama-server.log" 2>/dev/null && break
    kill -0 $server 2>/dev/null || { cat "$run/llama-server.log" >&2; exit 2; }
    sleep 0.2
done
export LOOPD_INFER_URL="unix:$PWD/$run/llama.sock" LOOPD_STATE_DIR="$PWD/$run/state"
status=0
for model in smollm2 smollm2-think; do
    echo "== $model"
    LOOPD_MODEL=$model $bin/loopd selftest "$@" || status=$?
done
exit $status
