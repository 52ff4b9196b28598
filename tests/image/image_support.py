"""Helpers for the image test: the operator account and its systemd user manager, what must be
present, the walk-through's commands, and the fake Mattermost's control API over its socket.

The test acts as an operator would: rootless podman under an ordinary account
(``$LOOPDTEST_IMAGE_USER``, made by ``make image``), with a systemd user manager of its own that
runs brokerd.service and loopd.service as written. The test machines run no systemd as PID 1, so
the manager is started by the test (as root): in a private mount namespace whose /run/systemd
says "booted with systemd", in a cgroup delegated to the account. Every operator command runs in
that namespace. The operator gets a fresh home and runtime folder under ``OPERATORS_DIR``, not in
/tmp: brokerd.service's PrivateTmp= would hide anything there.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pwd
import re
import shlex
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_TEST_USER = "loopd-image-test"
OPERATORS_DIR = Path("/home/loopd-image-test")
OPERATOR_PATH = "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin"
SYSTEMD = Path("/lib/systemd/systemd")
MANAGER_START_S = 60.0


def cache_dir() -> Path:
    return Path(os.environ.get("LOOPDEV_CACHE_DIR") or Path.home() / ".cache" / "loopd")


def image_archive() -> Path:
    return cache_dir() / "image" / "loopd-image.tar"


@contextlib.contextmanager
def image_cache_unchanged() -> Iterator[None]:
    """The image's cache (wheelhouse, archive) held still while it is copied: ``make image`` in
    another checkout rebuilds it under the exclusive side of the same lock (scripts/image.sh)."""
    lock = cache_dir() / "image" / ".build.lock"
    with lock.open("a") as held:
        fcntl.flock(held, fcntl.LOCK_SH)
        yield


def containers_conf() -> Path:
    return cache_dir() / "podman" / "containers.conf"


def test_user() -> str:
    return os.environ.get("LOOPDTEST_IMAGE_USER", DEFAULT_TEST_USER)


def missing_prerequisites() -> list[str]:
    """What the image test needs and this machine lacks, each with how to get it."""
    if os.geteuid() != 0:
        return [
            "root: the image test gives its operator account a systemd user manager of its own "
            "(a private mount namespace and a delegated cgroup)"
        ]
    missing = []
    for tool, package in (
        ("podman", "podman"),
        ("runc", "runc"),
        ("newuidmap", "uidmap"),
        ("systemd-analyze", "systemd"),
        ("bwrap", "bubblewrap"),
        ("unshare", "util-linux"),
        ("nsenter", "util-linux"),
        ("runuser", "util-linux"),
    ):
        if shutil.which(tool) is None:
            missing.append(f"{tool} (apt-get install {package}; `make image` does it as root)")
    if not SYSTEMD.exists():
        missing.append(f"{SYSTEMD} (apt-get install systemd)")
    for path in (image_archive(), containers_conf()):
        if not path.is_file():
            missing.append(f"{path} (run `make image`)")
    try:
        pwd.getpwnam(test_user())
    except KeyError:
        missing.append(f"the account {test_user()} (run `make image` as root)")
    for ids in ("/etc/subuid", "/etc/subgid"):
        try:
            lines = Path(ids).read_text().splitlines()
        except OSError:
            lines = []
        if not any(line.split(":")[0] == test_user() for line in lines):
            missing.append(f"subordinate ids for {test_user()} in {ids} (run `make image`)")
    return missing


@dataclass
class Operator:
    """The account that runs brokerd and rootless podman, with a home and runtime folder of its
    own for this test run, and (once started) its systemd user manager."""

    name: str
    uid: int
    gid: int
    root: Path
    home: Path
    runtime_dir: Path
    manager: subprocess.Popen[bytes] | None = None
    cgroups: list[Path] = field(default_factory=list)

    @classmethod
    def make(cls) -> Operator:
        entry = pwd.getpwnam(test_user())
        OPERATORS_DIR.mkdir(mode=0o755, exist_ok=True)
        # Socket paths must stay under ~100 bytes: a short folder name.
        root = Path(tempfile.mkdtemp(prefix="r", dir=OPERATORS_DIR))
        root.chmod(0o755)
        home, runtime_dir = root / "home", root / "run"
        for folder in (home, runtime_dir):
            folder.mkdir(mode=0o700)
            os.chown(folder, entry.pw_uid, entry.pw_gid)
        return cls(entry.pw_name, entry.pw_uid, entry.pw_gid, root, home, runtime_dir)

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """A login's environment: nothing of the test run's own."""
        return {
            "PATH": OPERATOR_PATH,
            "HOME": str(self.home),
            "USER": self.name,
            "LOGNAME": self.name,
            "XDG_RUNTIME_DIR": str(self.runtime_dir),
            "LANG": "C.UTF-8",
            **(extra or {}),
        }

    def argv(
        self, argv: Sequence[str], extra: Mapping[str, str] | None = None, cwd: Path | None = None
    ) -> list[str]:
        """``argv`` as the operator, in the manager's mount namespace (in ``cwd``, default the
        home), with only the operator's environment (plus ``extra``)."""
        assignments = [f"{key}={value}" for key, value in self.env(extra).items()]
        enter = []
        if self.manager is not None:
            enter = ["nsenter", "-t", str(self.manager.pid), "-m", f"--wd={cwd or self.home}", "--"]
        return [*enter, "runuser", "-u", self.name, "--", "env", "-i", *assignments, *argv]

    def run(
        self,
        argv: Sequence[str],
        *,
        input: str | None = None,
        timeout: float = 300,
        cwd: Path | None = None,
        extra: Mapping[str, str] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.argv(argv, extra, cwd),
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=cwd or self.home,
            check=False,
            stdin=None if input is not None else subprocess.DEVNULL,
        )

    def check(self, argv: Sequence[str], **kwargs: Any) -> str:
        """Run and return stdout; on failure, an AssertionError with the command and output."""
        result = self.run(argv, **kwargs)
        if result.returncode != 0:
            raise AssertionError(
                f"{shlex.join(argv)} exited {result.returncode}:\n{result.stdout}\n{result.stderr}"
            )
        return result.stdout

    def give(self, path: Path) -> None:
        """Make a file the test wrote the operator's, as if they had written it."""
        os.chown(path, self.uid, self.gid)

    # --- the systemd user manager ---------------------------------------------------------

    def start_manager(self) -> None:
        """``systemd --user`` for the operator, as a login would start it; returns once it runs."""
        self.cgroups = delegated_cgroups(f"loopd-image-test-{self.root.name}")
        for cgroup in self.cgroups:
            cgroup.mkdir()
            for entry in (cgroup, *cgroup.iterdir()):
                os.chown(entry, self.uid, self.gid)
        enter_cgroups = "".join(f"echo $$ > {c}/cgroup.procs && " for c in self.cgroups)
        assignments = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env().items())
        # The tmpfs is world-writable (its default mode) because PID 1 normally makes the
        # /run/systemd/inaccessible nodes units' sandboxes are built with; here the user manager
        # makes them itself.
        script = (
            "mkdir -p /run/systemd && mount -t tmpfs tmpfs /run/systemd && "
            f"mkdir /run/systemd/system && {enter_cgroups}"
            f"exec runuser -u {self.name} -- env -i {assignments} {SYSTEMD} --user"
        )
        log = (self.root / "systemd-user.log").open("wb")
        self.manager = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        log.close()
        deadline = time.monotonic() + MANAGER_START_S
        while True:
            state = self.run(["systemctl", "--user", "is-system-running"]).stdout.strip()
            if state in ("running", "degraded"):
                return
            if self.manager.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(
                    f"the operator's systemd user manager did not start ({state!r}):\n"
                    + (self.root / "systemd-user.log").read_text(errors="replace")
                )
            time.sleep(0.2)

    def stop_manager(self) -> None:
        """End the manager and everything left in its cgroups, then remove them."""
        if self.manager is not None and self.manager.poll() is None:
            self.run(["systemctl", "--user", "exit"], timeout=60)
            try:
                self.manager.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.manager.kill()
                self.manager.wait()
        for cgroup in self.cgroups:
            kill = cgroup / "cgroup.kill"  # unified hierarchy: everything still in it
            if kill.exists():
                kill.write_text("1")
        for cgroup in self.cgroups:
            remove_cgroup(cgroup)


def delegated_cgroups(name: str) -> list[Path]:
    """Where a user manager's cgroup goes: the unified hierarchy, and on a hybrid host the
    ``name=systemd`` one as well."""
    base = Path("/sys/fs/cgroup")
    if (base / "cgroup.controllers").exists():
        return [base / name]
    return [
        base / hierarchy / name
        for hierarchy in ("unified", "systemd")
        if (base / hierarchy).is_dir()
    ]


def remove_cgroup(cgroup: Path) -> None:
    """rmdir a cgroup and the ones below it, deepest first; processes may take a moment to go."""
    deadline = time.monotonic() + 30
    for folder in sorted((p for p in cgroup.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
        _rmdir(folder, deadline)
    if cgroup.exists():
        _rmdir(cgroup, deadline)


def _rmdir(folder: Path, deadline: float) -> None:
    while folder.exists():
        try:
            folder.rmdir()
        except FileNotFoundError:
            pass
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


# --- the walk-through's commands --------------------------------------------------------------


def walkthrough_sections(markdown: str) -> str:
    """The numbered sections of docs/deployment.md (``## 1. ...`` on): the walk-through from a
    clean host to a thread answered. The sections after it (MCP servers, ...) have tests of
    their own."""
    start = re.search(r"^## 1\. ", markdown, flags=re.MULTILINE)
    if start is None:
        raise AssertionError("docs/deployment.md has no section '## 1.'")
    rest = markdown[start.start() :]
    end = re.search(r"^## (?!\d+\. )", rest, flags=re.MULTILINE)
    return rest[: end.start()] if end else rest


def shell_commands(markdown: str) -> list[str]:
    """Every command in the ```sh blocks of a Markdown text: continued lines joined, comments
    and blank lines dropped."""
    commands = []
    for block in re.findall(r"^```sh\n(.*?)^```", markdown, flags=re.MULTILINE | re.DOTALL):
        pending = ""
        for raw in block.splitlines():
            line = re.sub(r"(^|\s)#\s.*$", "", raw).rstrip()
            if line.endswith("\\"):
                pending += line[:-1].strip() + " "
                continue
            line = (pending + line.strip()).strip()
            pending = ""
            if line:
                commands.append(line)
    return commands


# --- the fake Mattermost, from outside its process ------------------------------------------------


class FakeMattermost:
    """The control API (``/_fake``) of a fake Mattermost served on a Unix socket."""

    def __init__(self, uds: Path) -> None:
        self._client = httpx.Client(
            transport=httpx.HTTPTransport(uds=str(uds)), base_url="http://mattermost", timeout=30
        )

    def close(self) -> None:
        self._client.close()

    def state(self) -> dict[str, Any]:
        response = self._client.get("/_fake/state")
        response.raise_for_status()
        result: dict[str, Any] = response.json()
        return result

    def post_as(
        self, username: str, channel: str, message: str, *, root_id: str = ""
    ) -> dict[str, Any]:
        body = {"username": username, "channel": channel, "message": message, "root_id": root_id}
        response = self._client.post("/_fake/act/post_as", content=json.dumps(body))
        response.raise_for_status()
        result: dict[str, Any] = response.json()["result"]
        return result

    def log(self) -> list[dict[str, Any]]:
        response = self._client.get("/_fake/log")
        response.raise_for_status()
        entries: list[dict[str, Any]] = response.json()
        return entries

    def direct_channel(self, username: str) -> str:
        """The name of the DM channel between ``username`` and the bot."""
        state = self.state()
        ids = sorted((state["users"][username]["id"], state["bot"]["id"]))
        return "__".join(ids)

    def answers(self, root_id: str) -> list[dict[str, Any]]:
        """The bot's answer posts in a thread as they stand now: each post's last entry in the
        event log (an answer may be written into a post that was first the status), not status
        posts, not deleted ones."""
        bot = self.state()["bot"]["id"]
        latest: dict[str, dict[str, Any]] = {}
        for entry in self.log():
            latest[entry["post_id"]] = entry
        return [
            entry
            for entry in latest.values()
            if entry["action"] != "deleted"
            and entry["user_id"] == bot
            and entry["root_id"] == root_id
            and re.search(r"#\d+$", str(entry["props"].get("loopd_turn", "")))
        ]


def edit_toml(path: Path, values: Mapping[str, str]) -> None:
    """Set ``key = value`` lines (values given as TOML) in a config file, as an operator's editor
    would, uncommenting a ``# key = ...`` example; a key that is not in the file is an error, so
    the example cannot drift from the test."""
    text = path.read_text()
    for key, value in values.items():
        line = rf"^(# )?{re.escape(key)} = .*$"
        text, count = re.subn(line, f"{key} = {value}", text, flags=re.M)
        if count != 1:
            raise AssertionError(f"{path}: {count} lines set {key}")
    path.write_text(text)


def uncomment_toml(path: Path, keys: Sequence[str]) -> None:
    """Uncomment the ``# key = ...`` example of each key, keeping the example's value, as an
    operator turning a shipped setting on would; a key without one such line is an error."""
    text = path.read_text()
    for key in keys:
        text, count = re.subn(rf"^# ({re.escape(key)} = .*)$", r"\1", text, flags=re.M)
        if count != 1:
            raise AssertionError(f"{path}: {count} commented lines for {key}")
    path.write_text(text)


def edit_env(path: Path, values: Mapping[str, str]) -> None:
    """Set ``KEY=value`` lines in an environment file, the same way."""
    text = path.read_text()
    for key, value in values.items():
        text, count = re.subn(rf"^{re.escape(key)}=.*$", f"{key}={value}", text, flags=re.M)
        if count != 1:
            raise AssertionError(f"{path}: {count} lines set {key}")
    path.write_text(text)
