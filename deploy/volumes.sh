#!/usr/bin/env bash
# Give loopd's state and workspace volumes a filesystem each, of a size the operator sets (run as
# root, once, and again to grow one):
#
#  - an ext4 image file per volume, in /var/lib/loopd-volumes (--images), made sparse and with
#    no blocks reserved for root (the session log's own reserve is loopd's disk-reserve file);
#  - mounted by the kernel's loop driver on ~ACCOUNT/.local/share/loopd/state and .../workspace,
#    at every boot through /etc/fstab;
#  - with a folder `volume` in it, the account's, which the volume unit binds: where podman's
#    namespace does not see the mount (it started before it, on a host whose root mount is not
#    shared), the folder is missing there and the box does not start, instead of starting on
#    the account's disk.
#
# Rootless podman cannot mount a filesystem itself (the kernel refuses an unprivileged loop
# mount), so root does it here and deploy/loopd-*.volume bind the result (Type=bind). Nothing in
# the box can grow the filesystem: it has no capabilities, and the image file is outside it. A
# workspace filling its filesystem therefore leaves the state's filesystem, and the session log
# on it, untouched.
#
# A size is a number with an optional K, M, G or T suffix (powers of 1024). A larger size than
# the filesystem has grows it: in place while mounted where the host allows online resizing,
# else once it is unmounted (the script says how); a smaller one is refused.
#
# Usage: deploy/volumes.sh --user ACCOUNT --state-size SIZE --workspace-size SIZE
#            [--home DIR] [--images DIR] [--fstab FILE]
set -euo pipefail

account="" state_size="" workspace_size="" home="" images=/var/lib/loopd-volumes fstab=/etc/fstab
usage="usage: deploy/volumes.sh --user ACCOUNT --state-size SIZE --workspace-size SIZE [--home DIR] [--images DIR] [--fstab FILE]"
while [ $# -gt 0 ]; do
    case "$1" in
        --user) account=$2; shift 2 ;;
        --state-size) state_size=$2; shift 2 ;;
        --workspace-size) workspace_size=$2; shift 2 ;;
        --home) home=$2; shift 2 ;;
        --images) images=$2; shift 2 ;;
        --fstab) fstab=$2; shift 2 ;;
        *) echo "$usage" >&2; exit 2 ;;
    esac
done

log() { printf 'volumes: %s\n' "$*"; }
die() { printf 'volumes: %s\n' "$*" >&2; exit 1; }

[ -n "$account" ] && [ -n "$state_size" ] && [ -n "$workspace_size" ] || die "$usage"
[ "$(id -u)" = 0 ] || die "run as root (sudo): mounting a filesystem needs it"
entry=$(getent passwd "$account") || die "no account $account"
uid=$(printf '%s' "$entry" | cut -d: -f3)
gid=$(printf '%s' "$entry" | cut -d: -f4)
[ -n "$home" ] || home=$(printf '%s' "$entry" | cut -d: -f6)

bytes() { # SIZE -> bytes, or nothing for a size that is not one
    local number=${1%[KkMmGgTt]} unit=${1##*[0-9]}
    [[ "$number" =~ ^[0-9]+$ ]] || return 0
    case "$unit" in
        "") echo "$number" ;;
        K|k) echo $((number * 1024)) ;;
        M|m) echo $((number * 1024 ** 2)) ;;
        G|g) echo $((number * 1024 ** 3)) ;;
        T|t) echo $((number * 1024 ** 4)) ;;
    esac
}

filesystem_bytes() { # IMAGE -> the size of the ext4 filesystem in it (a grown image may hold a smaller one)
    dumpe2fs -h "$1" 2>/dev/null | awk '/^Block count:/ { n = $3 } /^Block size:/ { b = $3 } END { print n * b }'
}

grow() { # NAME IMAGE MOUNTPOINT SIZE CURRENT: a larger image, its filesystem grown to fill it
    local name=$1 image=$2 mountpoint=$3 size=$4 current=$5 device
    if mountpoint -q "$mountpoint"; then
        # Online growth needs CAP_SYS_RESOURCE, which a container's root may lack: then offline.
        device=$(findmnt -n -o SOURCE --target "$mountpoint")
        truncate -s "$size" "$image"
        losetup -c "$device"
        if ! resize2fs "$device" >/dev/null 2>&1; then
            truncate -s "$current" "$image" && losetup -c "$device"
            die "$name: cannot grow $image while it is mounted; stop loopd (systemctl --user stop loopd), umount $mountpoint and run this again"
        fi
    else
        truncate -s "$size" "$image"
        e2fsck -f -p "$image" >/dev/null
        resize2fs "$image" >/dev/null 2>&1 || die "$name: resize2fs $image failed; run it by hand to see why"
    fi
    log "$name: grown from $current to $size bytes"
}

volume() { # NAME SIZE: the image, its filesystem, its fstab line and its mount
    local name=$1 size_text=$2 size image mountpoint options line current
    size=$(bytes "$size_text")
    [ -n "$size" ] || die "--$name-size $size_text is not a size (a number, optionally K, M, G or T)"
    # ext4 needs room for its journal and tables; below this a volume holds almost nothing.
    [ "$size" -ge $((16 * 1024 ** 2)) ] || die "--$name-size $size_text is below 16M"
    image="$images/$account-$name.img"
    mountpoint="$home/.local/share/loopd/$name"
    # Not noexec, even for the state: podman's bind into the box keeps nodev and nosuid only,
    # and a user namespace may not drop a flag the mount has (runc's bind fails: EPERM).
    options=loop,nodev,nosuid

    install -d -m 0700 "$images"
    if [ ! -e "$image" ]; then
        truncate -s "$size" "$image"
        mkfs.ext4 -q -m 0 -E "root_owner=$uid:$gid" -L "loopd-$name" "$image"
    else
        current=$(filesystem_bytes "$image")
        [ "$size" -ge "$current" ] || die "$name: the filesystem in $image is $current bytes; --$name-size $size_text would shrink it (refused: copy the volume to a new one instead)"
        if [ "$size" -gt "$current" ]; then
            grow "$name" "$image" "$mountpoint" "$size" "$current"
        fi
    fi

    # The folders on the way that do not exist yet, the account's (install.sh makes some too).
    local folder
    for folder in "$home/.local" "$home/.local/share" "$home/.local/share/loopd" "$mountpoint"; do
        [ -d "$folder" ] || install -d -o "$uid" -g "$gid" -m 0700 "$folder"
    done
    # No fsck pass: the image is a file, not a block device (volumes.sh checks it when it grows).
    line="$image $mountpoint ext4 $options 0 0"
    touch "$fstab"
    if ! grep -qxF "$line" "$fstab"; then
        # One line per mount point: an older line for it (other options, another image) goes.
        grep -vF " $mountpoint ext4 " "$fstab" >"$fstab.loopd-part" || true
        printf '%s\n' "$line" >>"$fstab.loopd-part"
        cat "$fstab.loopd-part" >"$fstab"
        rm -f "$fstab.loopd-part"
    fi
    mountpoint -q "$mountpoint" || mount --fstab "$fstab" "$mountpoint"

    install -d -o "$uid" -g "$gid" -m 0700 "$mountpoint/volume"
    log "$name: $(df -h --output=size "$mountpoint" | tail -n 1 | tr -d ' ') ext4 on $mountpoint ($image, in $fstab)"
}

volume state "$state_size"
volume workspace "$workspace_size"
