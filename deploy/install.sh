#!/usr/bin/env bash
# Put loopd in place for the account running this (`make install` calls it after `make image`):
#
#  - brokerd, from the wheelhouse, in its own virtual environment: ~/.local/share/brokerd;
#  - the example configs, only where none exist yet (yours are never overwritten):
#    ~/.config/brokerd/brokerd.toml, ~/.config/loopd/loopd.toml and loopd.env, and the folders
#    ~/.config/loopd/expected (the self-test's expectations), ~/.local/state/brokerd and
#    ~/.local/state/loopd/metrics (loopd's metrics socket, mounted in the box);
#  - the units: brokerd.service, and loopd.container with its volumes for podman's quadlet
#    generator, or, where podman has none that reads it (before 4.7), the loopd.service it
#    would generate;
#  - the image, loaded into this account's podman from the archive `make image` saved;
#  - systemctl --user daemon-reload, when a user manager is running;
#  - a line for each volume that has no filesystem of its own yet (deploy/volumes.sh, as root,
#    makes them: this account cannot).
#
# Usage: deploy/install.sh --wheels DIR [--image FILE] [--containers-conf FILE]
set -euo pipefail

deploy=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$deploy")
wheels="" image="" containers_conf=""
while [ $# -gt 0 ]; do
    case "$1" in
        --wheels) wheels=$2; shift 2 ;;
        --image) image=$2; shift 2 ;;
        --containers-conf) containers_conf=$2; shift 2 ;;
        *) echo "usage: deploy/install.sh --wheels DIR [--image FILE] [--containers-conf FILE]" >&2
           exit 2 ;;
    esac
done

log() { printf 'install: %s\n' "$*"; }
die() { printf 'install: %s\n' "$*" >&2; exit 1; }

[ -n "$wheels" ] || die "--wheels DIR is required (make image writes it)"
wheel=$(ls "$wheels"/loopd-*.whl 2>/dev/null | head -n 1)
[ -n "$wheel" ] || die "no loopd wheel in $wheels; run make image"
[ -z "$image" ] || [ -r "$image" ] || die "cannot read the image archive $image; run make image"

# The paths the units name (%h/...), whatever XDG_* may say.
venv="$HOME/.local/share/brokerd"
units="${XDG_CONFIG_HOME:-$HOME/.config}/systemd/user"
quadlets="${XDG_CONFIG_HOME:-$HOME/.config}/containers/systemd"

# --- brokerd -----------------------------------------------------------------------------------
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
# The wheelhouse is made for the image's Python; on a host with another Python, the dependencies
# (pinned) come from PyPI instead.
if ! "$venv/bin/pip" install --quiet --no-index --find-links "$wheels" "$wheel" 2>/dev/null; then
    log "the wheelhouse does not fit $("$venv/bin/python" -V); fetching the dependencies from PyPI"
    "$venv/bin/pip" install --quiet "$wheel"
fi
# The same version number may carry new code: always put this wheel's files in place.
"$venv/bin/pip" install --quiet --no-index --no-deps --force-reinstall "$wheel"
log "brokerd: $venv/bin/brokerd"

# --- configs (never overwritten) -----------------------------------------------------------------
install -d -m 0700 "$HOME/.config/brokerd" "$HOME/.config/loopd" "$HOME/.local/state/brokerd"
# loopd.container mounts it (podman refuses to start the box without it); only this account and
# brokerd, running as it, may reach the socket loopd makes there.
install -d -m 0700 "$HOME/.local/state/loopd" "$HOME/.local/state/loopd/metrics"
install -d -m 0755 "$HOME/.config/loopd/expected"
copy_once() { # SOURCE DEST: the example, with the example account's home replaced by this one's
    if [ -e "$2" ]; then
        log "kept $2"
    else
        sed "s|/home/loopd|$HOME|g" "$1" >"$2"
        chmod 0600 "$2"
        log "wrote $2 (edit it)"
    fi
}
copy_once "$deploy/brokerd.toml" "$HOME/.config/brokerd/brokerd.toml"
copy_once "$deploy/loopd.toml" "$HOME/.config/loopd/loopd.toml"
copy_once "$deploy/loopd.env" "$HOME/.config/loopd/loopd.env"
if [ -n "$containers_conf" ] && [ ! -e "$HOME/.config/containers/containers.conf" ]; then
    install -D -m 0644 "$containers_conf" "$HOME/.config/containers/containers.conf"
    log "wrote $HOME/.config/containers/containers.conf (this host's podman settings)"
fi

# --- units --------------------------------------------------------------------------------------
install -d "$units"
install -m 0644 "$deploy/brokerd.service" "$units/brokerd.service"
log "wrote $units/brokerd.service"
# loopd.container and its volumes use keys quadlet reads from podman 4.7 on (Pull= and Unmask=
# from 4.6, VolumeName= from 4.7: an older quadlet refuses the unit for a key it does not know).
podman_version=$(podman --version | awk '{print $3}')
generator=""
if printf '4.7\n%s\n' "$podman_version" | sort -V -C; then
    for candidate in /usr/lib/systemd/user-generators/podman-user-generator \
        /usr/libexec/podman/quadlet /usr/lib/podman/quadlet; do
        [ -x "$candidate" ] && generator=$candidate && break
    done
fi
if [ -n "$generator" ]; then
    install -d "$quadlets"
    install -m 0644 "$deploy/loopd.container" "$deploy/loopd-state.volume" \
        "$deploy/loopd-workspace.volume" "$quadlets/"
    rm -f "$units/loopd.service"
    log "wrote loopd.container and its volumes to $quadlets ($generator makes loopd.service)"
else
    # quadlet's --cgroups=split needs the unified (v2) cgroup hierarchy; on a host with v1 or
    # hybrid cgroups the service takes podman's default mode instead.
    cgroups=split
    [ -e /sys/fs/cgroup/cgroup.controllers ] || cgroups=enabled
    python3 "$repo/scripts/quadlet.py" service --cgroups "$cgroups" "$deploy/loopd.container" \
        >"$units/loopd.service.part"
    mv "$units/loopd.service.part" "$units/loopd.service"
    log "wrote $units/loopd.service (podman $podman_version has no quadlet generator that reads" \
        "loopd.container: made from it by scripts/quadlet.py, --cgroups=$cgroups)"
fi

# --- the image ----------------------------------------------------------------------------------
if [ -n "$image" ]; then
    podman load --quiet -i "$image" >/dev/null
    log "loaded $image into $(id -un)'s podman"
fi
podman image exists localhost/loopd:latest || die "localhost/loopd:latest is not in $(id -un)'s podman; pass --image"

# --- the volumes' filesystems (made by root) ------------------------------------------------------
# loopd.container starts only once both are mounted (AssertPathIsMountPoint=).
for volume in state workspace; do
    if ! mountpoint -q "$HOME/.local/share/loopd/$volume"; then
        log "the $volume volume has no filesystem yet: as root, run deploy/volumes.sh --user" \
            "$(id -un) --state-size SIZE --workspace-size SIZE (docs/deployment.md, section 2)"
    fi
done

# --- systemd ------------------------------------------------------------------------------------
if systemctl --user show-environment >/dev/null 2>&1; then
    systemctl --user daemon-reload
    log "systemctl --user daemon-reload: done"
else
    log "no systemd user manager reachable here; once there is one: systemctl --user daemon-reload"
fi
