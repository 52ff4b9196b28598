"""npm packages the tests run with the machine's Node, installed once into the cache (outside
the repository), each set in a folder of its own, at pinned versions.

The install is the test set-up's one use of the network (the npm registry). Without Node or npm,
or when the install fails, the tests fail and say so: they are never skipped.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path

import pytest

NODE_MAJOR = 20


def cache_dir(name: str) -> Path:
    """``$LOOPDEV_CACHE_DIR/<name>``: one folder per set, as ``npm install`` removes from a
    folder what it was not asked for this time."""
    root = os.environ.get("LOOPDEV_CACHE_DIR") or str(Path.home() / ".cache" / "loopd")
    return Path(root) / name


def node(why: str) -> str:
    """The machine's Node (with npm), at least ``NODE_MAJOR``; the test fails otherwise."""
    found = shutil.which("node")
    if found is None or shutil.which("npm") is None:
        pytest.fail(f"{why} need Node and npm (apt-get install nodejs npm)")
    version = subprocess.run([found, "--version"], capture_output=True, text=True, check=True)
    major = int(version.stdout.strip().lstrip("v").split(".")[0])
    if major < NODE_MAJOR:
        pytest.fail(f"{why} need Node {NODE_MAJOR} or later, found {version.stdout}")
    return found


def installed(prefix: Path, packages: Mapping[str, str]) -> bool:
    """Every package is there at its pinned version."""
    for package, version in packages.items():
        manifest = prefix / "node_modules" / package / "package.json"
        if not manifest.exists() or json.loads(manifest.read_text()).get("version") != version:
            return False
    return True


def node_modules(prefix: Path, packages: Mapping[str, str]) -> Path:
    """``node_modules`` under ``prefix`` holding ``packages`` (name to version), installed
    unless they are there already."""
    prefix.mkdir(parents=True, exist_ok=True)
    with (prefix / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one install at a time across test sessions
        if not installed(prefix, packages):
            wanted = [f"{package}@{version}" for package, version in packages.items()]
            command = [
                "npm", "install", "--prefix", str(prefix), "--no-audit", "--no-fund",
                "--no-save", "--legacy-peer-deps", *wanted,
            ]  # fmt: skip
            done = subprocess.run(command, capture_output=True, text=True, timeout=600)
            if done.returncode != 0 or not installed(prefix, packages):
                pytest.fail(
                    f"could not install {' '.join(wanted)} into {prefix} "
                    f"({' '.join(command)}):\n{done.stdout}\n{done.stderr}"
                )
    return prefix / "node_modules"
