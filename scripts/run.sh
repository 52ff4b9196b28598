#!/usr/bin/env bash
# `make run`: the whole stack on the embedded default, no Mattermost and no GPU needed.
#   the real llama-server (router, tiny model) on state/run/llama.sock
#   brokerd on state/run/{infer,broker}.sock, in front of it
#   loopd chat in this terminal, talking to brokerd's inference proxy
# Everything started here stops when the chat ends, and leaves no socket behind.
#
# `make demo` (DEMO=1): the same, with the fake Mattermost and the demo's chat page (on
# 127.0.0.1:$DEMO_MM_PORT, 8065 by default), brokerd's chat proxy in front of the fake, and
# `loopd serve` in place of the chat, with its status page (127.0.0.1:$DEMO_STATUS_PORT, 8066) and
# a tool that asks before it runs (dev/loopd_dev/demo/brokerd.toml); Ctrl-C ends it. The fake's
# world is new at each start, so the demo's state is too: $LOOPD_STATE_DIR/demo, emptied first.
# Logs: $LOOPD_STATE_DIR/run/*.log (LOOPD_STATE_DIR defaults to state/ in the checkout; the
# demo's are under $LOOPD_STATE_DIR/demo/run).
#
# The servers run in sessions of their own (setsid): a Ctrl-C in this terminal reaches loopd chat
# alone, which stops the turn; the servers it talks to go on.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=.venv/bin
LOOPD_STATE_DIR="$(realpath -m "${LOOPD_STATE_DIR:-$PWD/state}")"
if [ -n "${DEMO:-}" ]; then
    # The demo's sessions answer the fake's threads, and the fake forgets its threads when it
    # stops: loopd's state is made anew with them, in a folder of the demo's own (the marker
    # says it is, so nothing else is ever emptied). One demo at a time per state folder.
    demo="$LOOPD_STATE_DIR/demo"
    mkdir -p "$LOOPD_STATE_DIR"
    exec 9>"$LOOPD_STATE_DIR/demo.lock"
    flock -n 9 || { echo "run: a demo is already running on $demo" >&2; exit 2; }
    if [ -e "$demo" ] && [ ! -e "$demo/.made-by-make-demo" ]; then
        echo "run: $demo was not made by make demo; move it away first" >&2; exit 2
    fi
    rm -rf "$demo"
    mkdir -p "$demo"
    touch "$demo/.made-by-make-demo"
    LOOPD_STATE_DIR="$demo"
fi
export LOOPD_STATE_DIR
run="${MAKE_RUN_DIR:-$LOOPD_STATE_DIR/run}"  # the sockets and logs (a test gives one of its own)
mkdir -p "$run"
run=$(cd "$run" && pwd)
pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    # llama-server leaves its Unix socket file when it is stopped.
    rm -f "$run/llama.sock"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

wait_for_socket() {  # path, what, pid
    for _ in $(seq 1 600); do
        [ -S "$1" ] && return 0
        kill -0 "$3" 2>/dev/null || { echo "run: $2 exited; see $run/$2.log" >&2; exit 1; }
        sleep 0.2
    done
    echo "run: $2 did not come up; see $run/$2.log" >&2; exit 1
}

# LOOPD_MODEL picks the model (a preset of loopd_dev.devserver: smollm2 unless set, or
# qwen-coder-agent, a model that really calls the tools and answers; loopd itself has no default
# model); the router loads it before ready, and the settings it needs (e.g. temperature 0) come
# with it unless the environment sets them.
export LOOPD_MODEL="${LOOPD_MODEL:-smollm2}"
load=(--load "$LOOPD_MODEL")
eval "$($bin/python -m loopd_dev.devserver --loopd-env "$LOOPD_MODEL")"
# The embedded model is 135 M parameters: left to production's max_tokens (12288) it can ramble
# for minutes. Unless the person (or the model's preset, above) set either limit, a turn here is
# at most 512 tokens, with no thinking cap (think_cap_leaves_answer_room needs 1024 above a cap).
if [ -z "${LOOPD_MAX_TOKENS:-}" ] && [ -z "${LOOPD_THINK_CAP:-}" ]; then
    export LOOPD_MAX_TOKENS=512 LOOPD_THINK_CAP=0
fi

echo "run: starting llama-server (router, $LOOPD_MODEL) ..." >&2
setsid $bin/python -m loopd_dev.devserver --socket "$run/llama.sock" --workdir "$run/devserver" \
    "${load[@]}" >"$run/llama-server.log" 2>&1 &
pids+=($!)
# The devserver prints "ready" once its models are loaded.
for _ in $(seq 1 600); do
    grep -q "ready at" "$run/llama-server.log" 2>/dev/null && break
    kill -0 "${pids[0]}" 2>/dev/null || { cat "$run/llama-server.log" >&2; exit 1; }
    sleep 0.2
done

only=(--only infer --only broker)
if [ -n "${DEMO:-}" ]; then
    mm_port="${DEMO_MM_PORT:-8065}"
    # loopd's status page, linked from the chat page.
    export LOOPD_METRICS_ADDR="${LOOPD_METRICS_ADDR:-127.0.0.1:${DEMO_STATUS_PORT:-8066}}"
    status_url=()
    case "$LOOPD_METRICS_ADDR" in
        unix:*) ;;
        *) status_url=(--status-url "http://$LOOPD_METRICS_ADDR/") ;;
    esac
    echo "run: starting the fake Mattermost and the chat page on 127.0.0.1:$mm_port ..." >&2
    setsid $bin/python -m loopd_dev.demo --port "$mm_port" "${status_url[@]}" \
        >"$run/mattermost.json" 2>"$run/mattermost.log" &
    pids+=($!)
    for _ in $(seq 1 300); do
        [ -s "$run/mattermost.json" ] && break
        kill -0 "${pids[-1]}" 2>/dev/null || { cat "$run/mattermost.log" >&2; exit 1; }
        sleep 0.2
    done
    mm="http://127.0.0.1:$mm_port"
    printf '%s' fake-bot-token >"$run/mm-token"
    export BROKERD_MATTERMOST_URL="$mm" BROKERD_MATTERMOST_TOKEN_FILE="$run/mm-token"
    # The fake's world is made anew at each start: brokerd lets the box act in all of it, and
    # loopd's own allowlists (alice and bob, ~dev) decide whom it answers.
    export BROKERD_CHAT_ALLOWED_TEAMS='["*"]' BROKERD_CHAT_ALLOWED_USERS='["*"]'
    # An approval to try: the catalogue's host_uptime runs only once a person allows it.
    export BROKERD_CONFIG="${BROKERD_CONFIG:-$PWD/dev/loopd_dev/demo/brokerd.toml}"
    only+=(--only chat)
fi

# brokerd in front of it: the inference proxy and the tool broker (and in the demo the chat
# proxy, which adds the bot's token), as in the deployment.
echo "run: starting brokerd (${only[*]}) ..." >&2
BROKERD_SOCKET_DIR="$run/brokerd" \
BROKERD_INFERENCE_URL="unix:$run/llama.sock" \
BROKERD_BROKER__AUDIT_DB="$run/brokerd-audit.db" \
    setsid $bin/brokerd serve "${only[@]}" >"$run/brokerd.log" 2>&1 &
pids+=($!)
wait_for_socket "$run/brokerd/infer.sock" brokerd "${pids[-1]}"
wait_for_socket "$run/brokerd/broker.sock" brokerd "${pids[-1]}"

export LOOPD_INFER_URL="unix:$run/brokerd/infer.sock"
export LOOPD_BROKER_URL="unix:$run/brokerd/broker.sock"

if [ -n "${DEMO:-}" ]; then
    wait_for_socket "$run/brokerd/chat.sock" brokerd "${pids[-1]}"
    export LOOPD_MM_URL="unix:$run/brokerd/chat.sock"
    export LOOPD_MM_ALLOWED_USERS="${LOOPD_MM_ALLOWED_USERS:-alice,bob}"
    export LOOPD_MM_ALLOWED_CHANNELS="${LOOPD_MM_ALLOWED_CHANNELS:-dev}"
    # The answer post is edited as the model writes; on the fake, often enough to watch it grow.
    export LOOPD_MM_STATUS_INTERVAL_S="${LOOPD_MM_STATUS_INTERVAL_S:-0.5}"
    echo "run: loopd serve, state in $LOOPD_STATE_DIR, logs in $run/loopd.log" >&2
    echo "demo: open $mm/ in a browser: you are alice in ~dev; mention @loopd to start a thread." >&2
    if [ ${#status_url[@]} -gt 0 ]; then
        echo "demo: loopd's status page is ${status_url[1]}" >&2
    fi
    echo "demo: an approval: host_uptime runs only once you react ✅ (❌ denies). SmolLM2 calls" \
        "no tools: with LOOPD_MODEL=qwen-coder-tools make demo, write in a thread" \
        "'@loopd Use find_tool with the query \"uptime\".'" \
        "then 'Call host_uptime with call_tool, with the arguments {}.'" >&2
    echo "demo: Ctrl-C ends it; the next make demo starts a new world." >&2
    # Its log goes to a file: this terminal says where the page is, and what ended the demo.
    status=0
    $bin/loopd serve --skip-selftest 2>"$run/loopd.log" || status=$?
    if [ "$status" != 0 ] && [ "$status" != 130 ]; then
        tail -n 5 "$run/loopd.log" >&2
        echo "run: loopd serve ended with status $status; see $run/loopd.log" >&2
    fi
    exit "$status"
fi
echo "run: loopd chat on $LOOPD_INFER_URL (state in $LOOPD_STATE_DIR); Ctrl-D ends it" >&2
# The chat runs as a job of its own with the terminal given to it (job control, set -m), so a
# Ctrl-C reaches the chat alone, which stops the turn: not this script, and not the make that
# started it (which would otherwise end `make run` with "Interrupt" once the chat ends).
# Ctrl-Z stops the chat alone too: this script then stops its own job (make and itself), so that
# the shell that ran `make run` has it to `fg`; continued, it gives the terminal back to the chat.
# The servers go on meanwhile.
status=0
set -m
$bin/loopd chat --session "${SESSION:-terminal}" || status=$?
while [ -n "$(jobs -sp)" ]; do
    kill -TSTP 0
    status=0
    fg %% >/dev/null || status=$?
done
set +m
exit "$status"
