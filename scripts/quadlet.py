#!/usr/bin/env python3
"""deploy/loopd.container as podman arguments, for hosts whose podman has no quadlet generator.

Podman 4.7 and later turn a ``.container`` file (with the keys loopd's uses) into a systemd
service at ``daemon-reload``. Older podman (Debian 12 ships 4.3) does not, so
``deploy/install.sh`` writes that service with ``service`` below, and the image test starts the
container with ``run-args``: both from the unit file itself, never from a hand-written copy of
its settings. Only the keys loopd's unit uses are translated, as podman-systemd.unit(5) documents
them; any other key is refused by name, so a new setting cannot be dropped silently.

    python3 scripts/quadlet.py service deploy/loopd.container > ~/.config/systemd/user/loopd.service
    python3 scripts/quadlet.py run-args deploy/loopd.container    # podman arguments, one per line

Standard library only: it runs on the host before any virtual environment exists.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

CONTAINER = "Container"
VOLUME = "Volume"
# The [Container] keys translated here, each as podman-systemd.unit(5) maps it.
KNOWN_KEYS = frozenset(
    {
        "Image",
        "Pull",
        "ContainerName",
        "Exec",
        "Network",
        "ReadOnly",
        "UserNS",
        "NoNewPrivileges",
        "DropCapability",
        "Volume",
        "Environment",
        "EnvironmentFile",
        "Unmask",
    }
)
# The [Volume] keys translated here: the name, and the mount a volume binds (podman volume create's
# --opt device=, type= and o=, as podman-systemd.unit(5) maps Device=, Type= and Options=).
KNOWN_VOLUME_KEYS = frozenset({"VolumeName", "Device", "Type", "Options"})
# systemd's specifiers that may appear in loopd's unit, expanded for a run outside systemd.
SPECIFIERS = ("h", "t", "U", "u")
_TRUE = frozenset({"1", "yes", "true", "on"})
_FALSE = frozenset({"0", "no", "false", "off"})


class QuadletError(ValueError):
    """A unit file this translation does not handle; the message names the file and the key."""


@dataclass(frozen=True)
class UnitFile:
    """A systemd unit file: each section's ``(key, value)`` pairs, in order."""

    name: str
    sections: dict[str, list[tuple[str, str]]] = field(default_factory=dict)

    def values(self, section: str, key: str) -> list[str]:
        return [value for k, value in self.sections.get(section, []) if k == key]

    def last(self, section: str, key: str) -> str | None:
        found = self.values(section, key)
        return found[-1] if found else None

    def boolean(self, section: str, key: str) -> bool | None:
        value = self.last(section, key)
        if value is None:
            return None
        if value.lower() in _TRUE:
            return True
        if value.lower() in _FALSE:
            return False
        raise QuadletError(f"{self.name}: [{section}] {key}={value} is not a boolean")


def parse_unit(text: str, name: str) -> UnitFile:
    """systemd's unit syntax: ``[Section]``, ``Key=Value``, ``#``/``;`` comments, and lines
    continued by a trailing backslash (joined with a space)."""
    unit = UnitFile(name)
    section: str | None = None
    pending = ""
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if pending and line[:1] in ("#", ";"):
            continue  # a comment inside a continued line is skipped
        if not pending and (not line or line[0] in "#;"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line, pending = pending + line, ""
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
            unit.sections.setdefault(section, [])
            continue
        key, equals, value = line.partition("=")
        if not equals or section is None:
            raise QuadletError(f"{name}:{number}: not a Key=Value line in a section: {raw!r}")
        unit.sections[section].append((key.strip(), value.strip()))
    return unit


def words(value: str) -> list[str]:
    """A value split into words with shell-like quoting, as systemd splits command lines."""
    return shlex.split(value)


def volume_name(unit: UnitFile, filename: str) -> str:
    """The podman volume a ``.volume`` unit makes: ``VolumeName=``, else ``systemd-<name>``."""
    return unit.last(VOLUME, "VolumeName") or f"systemd-{filename.removesuffix('.volume')}"


def volume_create_args(unit: UnitFile, filename: str) -> list[str] | None:
    """``podman volume create`` (from ``volume`` on) for a ``.volume`` unit with mount options, as
    quadlet's volume service runs it (less its ``--ignore``, which podman 4.3 lacks); ``None``
    for a plain volume, which ``podman run`` makes."""
    unknown = sorted({key for key, _ in unit.sections.get(VOLUME, [])} - KNOWN_VOLUME_KEYS)
    if unknown:
        raise QuadletError(
            f"{unit.name}: [{VOLUME}] {', '.join(unknown)} not translated by scripts/quadlet.py; "
            f"add it there (podman-systemd.unit(5) gives its option)"
        )
    device, kind, options = (unit.last(VOLUME, key) for key in ("Device", "Type", "Options"))
    if not (device or kind or options):
        return None
    if not device:
        raise QuadletError(f"{unit.name}: [{VOLUME}] Type= and Options= need Device=")
    args = ["volume", "create", "--opt", f"device={device}"]
    if kind:
        args += ["--opt", f"type={kind}"]
    if options:
        args += ["--opt", f"o={options}"]
    return [*args, volume_name(unit, filename)]


def podman_run_args(
    container: UnitFile,
    volumes: Mapping[str, UnitFile],
    *,
    under_systemd: bool,
    cgroups: str = "split",
) -> list[str]:
    """The ``podman`` arguments (from ``run`` on) the ``.container`` unit stands for.

    ``volumes`` maps a ``.volume`` file name used in ``Volume=`` to its parsed unit. With
    ``under_systemd``, the flags quadlet adds for a service (its own cgroup, readiness through
    conmon, detached) are added too; without, the container runs in the foreground, as for a
    test or a terminal. ``cgroups`` is the ``--cgroups`` mode of a service: quadlet's ``split``
    needs a unified (v2) cgroup hierarchy; a host without one takes podman's default,
    ``enabled``. systemd's specifiers (``%h``, ``%t``) are left for ``expand`` or systemd.
    """
    unknown = sorted({key for key, _ in container.sections.get(CONTAINER, [])} - KNOWN_KEYS)
    if unknown:
        raise QuadletError(
            f"{container.name}: [{CONTAINER}] {', '.join(unknown)} not translated by "
            f"scripts/quadlet.py; add it there (podman-systemd.unit(5) gives its flag)"
        )
    image = container.last(CONTAINER, "Image")
    if not image:
        raise QuadletError(f"{container.name}: [{CONTAINER}] Image= is required")
    name = container.last(CONTAINER, "ContainerName") or f"systemd-{Path(container.name).stem}"
    args = ["run", "--name", name, "--replace", "--rm"]
    if under_systemd:
        args += [f"--cgroups={cgroups}", "--sdnotify=conmon", "-d"]
    pull = container.last(CONTAINER, "Pull")
    if pull:
        args += ["--pull", pull]
    for network in container.values(CONTAINER, "Network"):
        args += ["--network", network]
    if container.boolean(CONTAINER, "NoNewPrivileges"):
        args.append("--security-opt=no-new-privileges")
    for value in container.values(CONTAINER, "DropCapability"):
        for capability in value.split():
            args += ["--cap-drop", capability.lower()]
    read_only = container.boolean(CONTAINER, "ReadOnly")
    if read_only is not None:
        args.append(f"--read-only={'true' if read_only else 'false'}")
    userns = container.last(CONTAINER, "UserNS")
    if userns:
        args += ["--userns", userns]
    for volume in container.values(CONTAINER, "Volume"):
        args += ["-v", _volume(container.name, volume, volumes)]
    for value in container.values(CONTAINER, "Environment"):
        for assignment in words(value):
            if "=" not in assignment:
                raise QuadletError(f"{container.name}: Environment={value}: not KEY=VALUE")
            args += ["--env", assignment]
    for value in container.values(CONTAINER, "EnvironmentFile"):
        for path in words(value):
            args += ["--env-file", path]
    for value in container.values(CONTAINER, "Unmask"):
        for path in words(value):
            args += ["--security-opt", f"unmask={path}"]
    args.append(image)
    exec_line = container.last(CONTAINER, "Exec")
    if exec_line:
        args += words(exec_line)
    return args


def _volume(unit_name: str, volume: str, volumes: Mapping[str, UnitFile]) -> str:
    source, colon, rest = volume.partition(":")
    if not colon:
        return volume  # an anonymous volume: only the path in the container
    if source.endswith(".volume"):
        if source not in volumes:
            raise QuadletError(f"{unit_name}: Volume={volume}: {source} was not given")
        source = volume_name(volumes[source], source)
    return f"{source}:{rest}"


def expand(arg: str, specifiers: Mapping[str, str]) -> str:
    """Replace systemd's specifiers (``%h``, ``%t``, ``%%``...) as systemd would."""

    def replace(match: re.Match[str]) -> str:
        letter = match.group(1)
        if letter == "%":
            return "%"
        if letter not in specifiers:
            raise QuadletError(f"specifier %{letter} in {arg!r} is not known here")
        return specifiers[letter]

    return re.sub(r"%(.)", replace, arg)


def user_specifiers(home: Path, runtime_dir: Path) -> dict[str, str]:
    """``%h``, ``%t``, ``%U``, ``%u`` for the user running this, given their home and runtime
    folder (a test passes its own)."""
    uid = os.getuid()
    try:
        import pwd

        user = pwd.getpwuid(uid).pw_name
    except KeyError:
        user = str(uid)
    return {"h": str(home), "t": str(runtime_dir), "U": str(uid), "u": user}


def systemd_quote(arg: str) -> str:
    """One command-line word as a unit file's ``ExecStart=`` reads it back."""
    if arg and not re.search(r"[\s\"'\\;]", arg):
        return arg
    escaped = arg.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'


def service_unit(
    container: UnitFile, volumes: Mapping[str, UnitFile], podman: str, cgroups: str = "split"
) -> str:
    """The systemd service quadlet would generate for the unit, with the same flags."""
    name = container.last(CONTAINER, "ContainerName") or f"systemd-{Path(container.name).stem}"
    run = [podman, *podman_run_args(container, volumes, under_systemd=True, cgroups=cgroups)]
    stop = [podman, "rm", "-v", "-f", "-i", name]
    # quadlet makes each volume with options in a service of its own before the container's
    # (`volume create --ignore`); here the container's service makes the missing ones first.
    creates = []
    for filename, volume in volumes.items():
        create = volume_create_args(volume, filename)
        if create is not None:
            exists = shlex.join([podman, "volume", "exists", create[-1]])
            script = f"{exists} || {shlex.join([podman, *create])}"
            creates.append(("ExecStartPre", f"/bin/sh -c {systemd_quote(script)}"))
    lines = [
        f"# Generated from {Path(container.name).name} by scripts/quadlet.py, as podman's quadlet",
        "# generator (podman 4.7 and later) would; edit the .container file, not this one.",
    ]

    def section(title: str, pairs: Sequence[tuple[str, str]]) -> list[str]:
        return ["", f"[{title}]", *(f"{key}={value}" for key, value in pairs)]

    for title, pairs in container.sections.items():
        if title not in (CONTAINER, "Service", "Install"):
            lines += section(title, pairs)
    lines += section(
        "Service",
        [
            ("Environment", "PODMAN_SYSTEMD_UNIT=%n"),
            ("KillMode", "mixed"),
            ("Delegate", "yes"),
            ("Type", "notify"),
            ("NotifyAccess", "all"),
            ("SyslogIdentifier", "%N"),
            *creates,
            ("ExecStart", " ".join(systemd_quote(arg) for arg in run)),
            ("ExecStop", " ".join(systemd_quote(arg) for arg in stop)),
            ("ExecStopPost", "-" + " ".join(systemd_quote(arg) for arg in stop)),
            *container.sections.get("Service", []),
        ],
    )
    if "Install" in container.sections:
        lines += section("Install", container.sections["Install"])
    return "\n".join(lines) + "\n"


def exec_start(
    service: UnitFile, specifiers: Mapping[str, str]
) -> tuple[list[str], dict[str, str]]:
    """A plain service's command and the environment its unit sets, specifiers expanded: what
    systemd would run (brokerd.service), for a host or test without a user manager."""
    command = service.last("Service", "ExecStart")
    if not command:
        raise QuadletError(f"{service.name}: [Service] ExecStart= is required")
    argv = [expand(word, specifiers) for word in words(command.lstrip("-@:+!"))]
    env: dict[str, str] = {}
    for value in service.values("Service", "Environment"):
        for assignment in words(value):
            key, _, val = assignment.partition("=")
            env[key] = expand(val, specifiers)
    return argv, env


def load_container(path: Path) -> tuple[UnitFile, dict[str, UnitFile]]:
    """A ``.container`` file and the ``.volume`` files it names, read from its folder."""
    container = parse_unit(path.read_text(), str(path))
    volumes: dict[str, UnitFile] = {}
    for volume in container.values(CONTAINER, "Volume"):
        source = volume.partition(":")[0]
        if source.endswith(".volume"):
            volume_path = path.parent / source
            volumes[source] = parse_unit(volume_path.read_text(), str(volume_path))
    return container, volumes


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/quadlet.py", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    service = sub.add_parser("service", help="print the systemd service for a .container file")
    service.add_argument("container", type=Path)
    service.add_argument("--podman", default=shutil.which("podman") or "/usr/bin/podman")
    service.add_argument(
        "--cgroups",
        default="split",
        choices=("split", "enabled", "no-conmon", "disabled"),
        help="podman's --cgroups mode (default split, as quadlet; it needs cgroup v2)",
    )
    run = sub.add_parser("run-args", help="print the podman arguments, one per line")
    run.add_argument("container", type=Path)
    run.add_argument("--home", type=Path, default=Path.home())
    run.add_argument("--runtime-dir", type=Path, default=os.environ.get("XDG_RUNTIME_DIR"))
    args = parser.parse_args(argv)
    if args.command == "run-args" and args.runtime_dir is None:
        print("scripts/quadlet.py: XDG_RUNTIME_DIR is not set; pass --runtime-dir", file=sys.stderr)
        return 2
    try:
        container, volumes = load_container(args.container)
        if args.command == "service":
            sys.stdout.write(service_unit(container, volumes, args.podman, args.cgroups))
            return 0
        specifiers = user_specifiers(args.home, args.runtime_dir)
        for arg in podman_run_args(container, volumes, under_systemd=False):
            print(expand(arg, specifiers))
    except (OSError, QuadletError) as exc:
        print(f"scripts/quadlet.py: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
