"""The shipped units give the state and the workspaces a filesystem each, of the operator's size.

deploy/volumes.sh (as root) makes and mounts the two filesystems; deploy/loopd-*.volume bind
them (``Type=bind``, which rootless podman can mount); loopd.container starts only with both
mounted. These tests read the unit files as quadlet (podman 4.7 and later) and scripts/quadlet.py
(older podman) do; tests/security/test_volume_sizes.py fills the real filesystems from the box.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from scripts import quadlet

REPO_ROOT = Path(__file__).resolve().parents[2]
DEPLOY = REPO_ROOT / "deploy"
VOLUMES = ("state", "workspace")
MOUNT_POINT = "%h/.local/share/loopd/{}"
# What a volume binds: a folder in the filesystem, missing where the filesystem is not mounted.
BOUND = MOUNT_POINT + "/volume"
# The [Volume] keys podman-systemd.unit(5) documents for podman 4.7, the first quadlet that reads
# VolumeName= (an older one refuses the whole unit for a key it does not know).
QUADLET_4_7_VOLUME_KEYS = frozenset(
    {"Copy", "Device", "Group", "Label", "Options", "PodmanArgs", "Type", "User", "VolumeName"}
)


def volume_unit(name: str) -> quadlet.UnitFile:
    path = DEPLOY / f"loopd-{name}.volume"
    return quadlet.parse_unit(path.read_text(), str(path))


def test_each_volume_binds_the_folder_volumes_sh_mounts() -> None:
    script = (DEPLOY / "volumes.sh").read_text()
    assert 'mountpoint="$home/.local/share/loopd/$name"' in script
    assert 'install -d -o "$uid" -g "$gid" -m 0700 "$mountpoint/volume"' in script
    for name in VOLUMES:
        unit = volume_unit(name)
        assert unit.last("Volume", "VolumeName") == f"loopd-{name}"
        assert unit.last("Volume", "Device") == BOUND.format(name)
        assert unit.last("Volume", "Type") == "bind"
    container, _ = quadlet.load_container(DEPLOY / "loopd.container")
    assert container.values("Unit", "AssertPathIsMountPoint") == [
        MOUNT_POINT.format(name) for name in VOLUMES
    ]


def test_the_volume_units_use_only_keys_the_quadlet_install_sh_picks_reads() -> None:
    for name in VOLUMES:
        keys = {key for key, _ in volume_unit(name).sections["Volume"]}
        assert keys <= QUADLET_4_7_VOLUME_KEYS, name
    install = (DEPLOY / "install.sh").read_text()
    assert "if printf '4.7\\n%s\\n' \"$podman_version\" | sort -V -C; then" in install


def test_the_service_for_older_podman_makes_each_volume_on_its_filesystem() -> None:
    container, volumes = quadlet.load_container(DEPLOY / "loopd.container")
    service = quadlet.parse_unit(
        quadlet.service_unit(container, volumes, "/usr/bin/podman"), "loopd.service"
    )
    scripts = []
    for line in service.values("Service", "ExecStartPre"):
        shell, flag, script = shlex.split(line)
        assert (shell, flag) == ("/bin/sh", "-c")
        scripts.append(script)
    assert scripts == [
        f"/usr/bin/podman volume exists loopd-{name} || /usr/bin/podman volume create "
        f"--opt device={BOUND.format(name)} --opt type=bind loopd-{name}"
        for name in VOLUMES
    ]
    assert service.values("Unit", "AssertPathIsMountPoint") == [
        MOUNT_POINT.format(name) for name in VOLUMES
    ]


def test_a_volume_key_the_translation_does_not_know_is_refused_by_name() -> None:
    unit = quadlet.parse_unit("[Volume]\nDevice=/d\nCopy=true\n", "data.volume")
    with pytest.raises(quadlet.QuadletError, match=r"data.volume: \[Volume\] Copy not translated"):
        quadlet.volume_create_args(unit, "data.volume")


def quadlet_generator() -> str | None:
    for candidate in ("/usr/libexec/podman/quadlet", "/usr/lib/podman/quadlet"):
        if os.access(candidate, os.X_OK):
            return candidate
    return None


def test_podmans_own_quadlet_makes_the_sized_volumes(tmp_path: Path) -> None:
    """Where podman ships its generator (4.7 and later), its dry run of the shipped units."""
    generator = quadlet_generator()
    if generator is None:
        pytest.skip("no quadlet generator here (podman before 4.7); scripts/quadlet.py is tested")
    units = tmp_path / "units"
    units.mkdir()
    for name in ("loopd.container", "loopd-state.volume", "loopd-workspace.volume"):
        shutil.copy(DEPLOY / name, units / name)
    result = subprocess.run(
        [generator, "-dryrun", "-user"],
        env={**os.environ, "QUADLET_UNIT_DIRS": str(units)},
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    for name in VOLUMES:
        assert f"--opt device={BOUND.format(name)} --opt type=bind" in result.stdout
