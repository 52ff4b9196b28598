"""The official Mattermost JavaScript client, installed once into the cache (outside the
repository) with the machine's Node and npm, and the fake it is pointed at.

The install is the test set-up's one use of the network (the npm registry). Without Node or npm,
or when the install fails, the tests fail and say so: they are never skipped.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest

from loopd_dev.fakes.mattermost import FakeConfig, RunningFake, serve_fake_mattermost

CLIENT_VERSION = "11.9.0"
# The client needs its types package at run time (a peer dependency); TypeScript it does not.
PACKAGES = ("@mattermost/client", "@mattermost/types")
NODE_MAJOR = 20  # WebSocket is global from Node 22; on 20 it is behind --experimental-websocket
FAST = FakeConfig(auth_timeout_s=2.0, ping_interval_s=5.0, pong_wait_s=10.0)


def cache_dir() -> Path:
    root = os.environ.get("LOOPDEV_CACHE_DIR") or str(Path.home() / ".cache" / "loopd")
    return Path(root) / "npm"


def installed(prefix: Path) -> bool:
    """Both packages are there at the pinned version."""
    for package in PACKAGES:
        manifest = prefix / "node_modules" / package / "package.json"
        if not manifest.exists() or json.loads(manifest.read_text()).get("version") != (
            CLIENT_VERSION
        ):
            return False
    return True


@pytest.fixture(scope="session")
def node() -> str:
    found = shutil.which("node")
    if found is None or shutil.which("npm") is None:
        pytest.fail("the conformance tests need Node and npm (apt-get install nodejs npm)")
    version = subprocess.run([found, "--version"], capture_output=True, text=True, check=True)
    major = int(version.stdout.strip().lstrip("v").split(".")[0])
    if major < NODE_MAJOR:
        pytest.fail(
            f"the conformance tests need Node {NODE_MAJOR} or later, found {version.stdout}"
        )
    return found


@pytest.fixture(scope="session")
def client_modules(node: str) -> Path:
    """``node_modules`` holding ``@mattermost/client`` (and its types) at the pinned version."""
    prefix = cache_dir()
    prefix.mkdir(parents=True, exist_ok=True)
    with (prefix / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one install at a time across test sessions
        if not installed(prefix):
            wanted = [f"{package}@{CLIENT_VERSION}" for package in PACKAGES]
            command = [
                "npm", "install", "--prefix", str(prefix), "--no-audit", "--no-fund",
                "--no-save", "--legacy-peer-deps", *wanted,
            ]  # fmt: skip
            done = subprocess.run(command, capture_output=True, text=True, timeout=600)
            if done.returncode != 0 or not installed(prefix):
                pytest.fail(
                    f"could not install {' '.join(wanted)} into {prefix} "
                    f"({' '.join(command)}):\n{done.stdout}\n{done.stderr}"
                )
    return prefix / "node_modules"


@pytest.fixture
async def mm() -> AsyncIterator[RunningFake]:
    """The fake on loopback TCP (Node's fetch and WebSocket speak TCP)."""
    async with (
        anyio.create_task_group() as tg,
        serve_fake_mattermost(tg, config=FAST) as running,
    ):
        yield running
        tg.cancel_scope.cancel()


@pytest.fixture
def scripts() -> Path:
    return Path(__file__).parent / "js"
