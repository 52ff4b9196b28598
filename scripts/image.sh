#!/usr/bin/env bash
# Build loopd's container image (deploy/Containerfile) with podman, with no image registry.
#
#  1. podman, runc, mmdebstrap and uidmap (apt-get install, as root, when missing), and a
#     containers.conf for this kind of host: runc (crun refuses hybrid cgroups), cgroupfs, and
#     no default ulimits (podman's exceed the hard limit here). CONTAINERS_CONF names it.
#  2. The base: a minimal Debian (python3, python3-venv, bubblewrap) made by mmdebstrap from
#     Debian's packages and imported into podman. Cached as a tar in $LOOPDEV_CACHE_DIR/image,
#     keyed by its package list, so a second run skips it.
#  3. The wheelhouse: loopd's wheel, built from a clean copy of this tree, and its dependencies
#     for the image's Python, fetched from PyPI only when the dependency list changes.
#  4. `podman build --network=none` of deploy/Containerfile, then `podman save` of the image to
#     $LOOPDEV_CACHE_DIR/image/loopd-image.tar, which deploy/install.sh loads for another account
#     (or another host: no registry needed).
#
# Usage: scripts/image.sh [deps|build]     (build does deps first)
# Run as root, `deps` also makes the account the image test runs rootless podman as
# ($LOOPDTEST_IMAGE_USER, default loopd-image-test; no home, no login, subordinate ids).
set -euo pipefail

cd "$(dirname "$0")/.."
cache="${LOOPDEV_CACHE_DIR:-$HOME/.cache/loopd}"
python="${PYTHON:-python3}"
image="${LOOPD_IMAGE:-localhost/loopd:latest}"
image_dir="$cache/image"
conf="$cache/podman/containers.conf"
test_user="${LOOPDTEST_IMAGE_USER:-loopd-image-test}"

# The base: Debian 12, whose python3 is 3.11; the wheels are fetched for that Python.
suite=bookworm
packages=python3,python3-venv,bubblewrap,passwd
target_python=3.11

log() { printf 'image: %s\n' "$*" >&2; }
die() { printf 'image: %s\n' "$*" >&2; exit 1; }

deps() {
    local missing=()
    command -v podman >/dev/null || missing+=(podman)
    command -v runc >/dev/null || missing+=(runc)
    command -v mmdebstrap >/dev/null || missing+=(mmdebstrap)
    command -v newuidmap >/dev/null || missing+=(uidmap)
    if [ ${#missing[@]} -gt 0 ]; then
        if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
            log "installing ${missing[*]}"
            apt-get install -y -qq "${missing[@]}" >/dev/null 2>&1 \
                || { apt-get update -qq && apt-get install -y -qq "${missing[@]}" >/dev/null; }
        else
            die "missing ${missing[*]}; install them: sudo apt-get install ${missing[*]}"
        fi
    fi
    mkdir -p "$(dirname "$conf")"
    local wanted
    wanted=$'# Written by scripts/image.sh for this host: runc (crun refuses hybrid cgroups),\n# cgroupfs, and no default ulimits (podman\'s exceed the hard limit on these machines).\n[containers]\ndefault_ulimits = []\n\n[engine]\ncgroup_manager = "cgroupfs"\nruntime = "runc"\n'
    if [ ! -f "$conf" ] || [ "$(cat "$conf")"$'\n' != "$wanted" ]; then
        printf '%s' "$wanted" >"$conf"
        log "wrote $conf"
    fi
    if [ "$(id -u)" = 0 ]; then
        test_account
    fi
}

# Rootless podman needs an account with subordinate ids; the image test, run as root, acts as
# this operator so that UserNS=keep-id and the sockets' modes mean what they mean in production.
test_account() {
    if ! id "$test_user" >/dev/null 2>&1; then
        useradd --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin \
            --comment "loopd image test operator" "$test_user"
        log "made the account $test_user (for the image test)"
    fi
    local file
    for file in /etc/subuid /etc/subgid; do
        if ! grep -q "^$test_user:" "$file" 2>/dev/null; then
            local flag=--add-subuids
            [ "$file" = /etc/subgid ] && flag=--add-subgids
            local start
            start=$(awk -F: '{ end = $2 + $3; if (end > max) max = end } END { print (max > 100000 ? max : 100000) }' "$file" 2>/dev/null || echo 100000)
            usermod "$flag" "$start-$((start + 65535))" "$test_user"
        fi
    done
}

base_tag() {
    local key
    key=$(printf '%s %s %s' "$suite" "$packages" minbase | sha256sum | cut -c1-12)
    echo "localhost/loopd-base:$suite-$key"
}

base() {
    local tag tar
    tag=$(base_tag)
    tar="$image_dir/base-${tag##*:}.tar"
    if podman image exists "$tag"; then
        log "base $tag already in podman (no mmdebstrap)"
        return
    fi
    if [ ! -s "$tar" ]; then
        log "mmdebstrap $suite with $packages (about 30 s and 60 MB of downloads)"
        mkdir -p "$image_dir"
        # mmdebstrap picks the format from the name: the partial file must end in .tar too.
        mmdebstrap --quiet --variant=minbase --include="$packages" "$suite" "${tar%.tar}.part.tar"
        mv "${tar%.tar}.part.tar" "$tar"
    fi
    podman import --quiet "$tar" "$tag" >/dev/null
    log "imported $tar as $tag"
}

wheels() {
    local context="$image_dir/context" deps="$image_dir/wheels" source
    source=$(mktemp -d)
    # setuptools writes build/ and *.egg-info into the tree it builds: build from a copy.
    "$python" - "$source" <<'EOF'
import shutil, sys
shutil.copytree(".", sys.argv[1] + "/loopd", symlinks=True,
    ignore=shutil.ignore_patterns(".*", "build", "*.egg-info", "__pycache__", "state", "workspace"))
EOF
    rm -rf "$context"
    mkdir -p "$context/wheels" "$deps"
    # A fixed zip timestamp: the same tree gives the same wheel, so the image is not rebuilt.
    SOURCE_DATE_EPOCH=315532800 "$python" -m pip wheel --quiet --no-deps -w "$context/wheels" \
        "$source/loopd"
    rm -rf "$source"
    local wheel stamp
    wheel=$(echo "$context"/wheels/loopd-*.whl)
    # Fetched again only when loopd's dependencies (or the target Python) change.
    stamp=$("$python" - "$wheel" "$target_python $(uname -m)" <<'EOF'
import hashlib, sys, zipfile
wheel = zipfile.ZipFile(sys.argv[1])
[metadata] = [n for n in wheel.namelist() if n.endswith(".dist-info/METADATA")]
requires = [line for line in wheel.read(metadata).decode().splitlines()
            if line.startswith("Requires-Dist:") and "extra ==" not in line]
print(hashlib.sha256("\n".join([*requires, sys.argv[2]]).encode()).hexdigest()[:16])
EOF
)
    if [ "$(cat "$deps/.stamp" 2>/dev/null)" != "$stamp" ]; then
        log "fetching loopd's dependencies for Python $target_python from PyPI"
        rm -f "$deps"/*.whl
        "$python" -m pip download --quiet --only-binary=:all: --dest "$deps" \
            --python-version "$target_python" --implementation cp \
            --abi "cp${target_python/./}" --platform "manylinux2014_$(uname -m)" \
            --platform "manylinux_2_28_$(uname -m)" "$wheel"
        rm -f "$deps"/loopd-*.whl
        echo "$stamp" >"$deps/.stamp"
    else
        log "dependencies unchanged ($deps)"
    fi
    ln "$deps"/*.whl "$context/wheels/" 2>/dev/null || cp "$deps"/*.whl "$context/wheels/"
}

# What the image is made of: when none of it changed and the image exists, nothing is rebuilt.
inputs_stamp() {
    { (cd "$image_dir/context/wheels" && sha256sum -- *.whl); sha256sum deploy/Containerfile;
      base_tag; } | sha256sum | cut -c1-16
}

build() {
    deps
    export CONTAINERS_CONF="$conf"
    local started=$SECONDS
    # One build at a time per cache: two checkouts building at once (a second `make test`
    # beside the first) share the context, the wheelhouse and the image's tag.
    mkdir -p "$image_dir"
    exec 9>"$image_dir/.build.lock"
    if ! flock --nonblock 9; then
        log "another build of the image is under way; waiting for it"
        flock 9
    fi
    base
    wheels
    local stamp
    stamp=$(inputs_stamp)
    if podman image exists "$image" && [ "$(cat "$image_dir/inputs.stamp" 2>/dev/null)" = "$stamp" ] \
        && [ -s "$image_dir/loopd-image.tar" ]; then
        log "$image is up to date (same wheels, Containerfile and base)"
    else
        local previous=""
        if podman image exists "$image"; then
            previous=$(podman image inspect --format '{{.Id}}' "$image")
        fi
        log "podman build --network=none -f deploy/Containerfile -t $image"
        # --layers=false: only the final image is kept; the build stage leaves nothing behind.
        podman build --quiet --layers=false --network=none --build-arg "BASE=$(base_tag)" \
            -f deploy/Containerfile -t "$image" "$image_dir/context" >/dev/null
        local id
        id=$(podman image inspect --format '{{.Id}}' "$image")
        if [ -n "$previous" ] && [ "$previous" != "$id" ]; then
            podman rmi --force "$previous" >/dev/null 2>&1 || true
        fi
        podman save --quiet -o "$image_dir/loopd-image.tar.part" "$image"
        mv "$image_dir/loopd-image.tar.part" "$image_dir/loopd-image.tar"
        echo "$stamp" >"$image_dir/inputs.stamp"
    fi
    local size
    size=$(podman image inspect --format '{{.Size}}' "$image")
    log "$image: $((size / 1000000)) MB, ready in $((SECONDS - started)) s;" \
        "saved as $image_dir/loopd-image.tar"
}

case "${1:-build}" in
    deps) deps ;;
    build) build ;;
    *) die "usage: scripts/image.sh [deps|build]" ;;
esac
