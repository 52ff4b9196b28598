"""Acceptance: the shipped image, installed and run as docs/deployment.md says, answers a thread.

One walk-through serves every test here, acting as a new operator on this host: an ordinary
account with rootless podman and a systemd user manager of its own (see image_support), a fresh
home. It runs the walk-through's commands as written: ``make install``'s recipe, the bot token,
``systemctl --user enable --now brokerd`` (brokerd.service with its sandboxing, ``Type=notify``),
the expectations recorded with the image, ``systemctl --user start loopd`` (the service made from
loopd.container: podman 4.3 has no quadlet generator), ``podman exec``, and the restart. brokerd
sits in front of the real llama-server (TCP on loopback) and the fake Mattermost (a Unix socket
standing in for its HTTPS). A direct message is answered, the box is probed from inside, and
both services are restarted and answer again in the same thread.

The few commands that cannot run here are in ``STOOD_IN`` with what the test does instead; a
test keeps that list and the walk-through's commands equal. Where podman, systemd or the image
are missing, the tests fail naming what is missing.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from loopd_dev import devserver
from scripts import quadlet
from tests.e2e.e2e_support import Child, ChildFailed, minimal_env
from tests.image.image_support import (
    REPO_ROOT,
    FakeMattermost,
    Operator,
    cache_dir,
    containers_conf,
    edit_env,
    edit_toml,
    image_archive,
    image_cache_unchanged,
    missing_prerequisites,
    shell_commands,
    uncomment_toml,
    walkthrough_sections,
)

pytestmark = [pytest.mark.real_server, pytest.mark.slow, pytest.mark.timeout(1800)]

DOCS = REPO_ROOT / "docs" / "deployment.md"
STARTUP_S = 300.0  # loopd's self-test against the real server, on a loaded two-core machine
TURN_S = 240.0  # one answer of the real model on a slow, loaded machine
OUTSIDE_ADDRESS = "10.255.255.1:80"  # routed nowhere; inside the box it must fail at once
NO_ROUTE = {"ENETUNREACH", "ECONNREFUSED", "EHOSTUNREACH", "EADDRNOTAVAIL"}
# systemd-analyze security's exposure for brokerd.service, at most, in tenths: 2.9 ("OK") today,
# what is left being the network and the namespaces its bubblewrap confinement needs.
SECURITY_THRESHOLD = 30
SERVING = "serving Mattermost as"

# The walk-through's commands the test does not run as written, and what it does instead.
# Every other command in docs/deployment.md is run verbatim by the operator.
STOOD_IN = {
    "sudo apt-get install podman runc mmdebstrap uidmap python3-venv": (
        "scripts/image.sh deps installs them (as root) when `make test` runs `make image`"
    ),
    "sudo deploy/volumes.sh --user loopd --state-size 4G --workspace-size 40G": (
        "run as root in the user manager's mount namespace, for the test's account and home, "
        "with sizes of 128M and 512M"
    ),
    "make image": "run by `make test` before the tests; the test loads the archive it saved",
    "make install": "its recipe (`make -n -o image install`) runs as the operator",
    "$EDITOR ~/.config/brokerd/brokerd.toml": (
        "edit_toml sets the server, Mattermost and who the box may post to"
    ),
    "$EDITOR ~/.config/loopd/loopd.toml ~/.config/loopd/loopd.env": (
        "edit_toml and edit_env set the model, the slot and the allowed user"
    ),
    'loginctl enable-linger "$USER"': "not run: no systemd-logind on the test machines",
    "journalctl --user -u loopd -f": (
        "`podman logs loopd`: the test's user manager has no journal to read"
    ),
}


@dataclass
class Walkthrough:
    """The deployment as the walk-through leaves it, and what each step printed."""

    operator: Operator
    bot_token: str
    llama: devserver.RunningServer
    mm: FakeMattermost
    docs: list[str]
    ran: list[str] = field(default_factory=list)
    sockets_when_started: list[str] = field(default_factory=list)
    brokerd_unit: dict[str, str] = field(default_factory=dict)
    loopd_logs: list[str] = field(default_factory=list)
    thread: str = ""
    answers: list[list[dict[str, Any]]] = field(default_factory=list)
    sessions: str = ""
    network: dict[str, Any] = field(default_factory=dict)
    box: dict[str, Any] = field(default_factory=dict)
    inspect: str = ""
    verify: subprocess.CompletedProcess[str] | None = None
    security: subprocess.CompletedProcess[str] | None = None
    sessions_after_restart: str = ""
    workspace_kept: bool = False
    timings: dict[str, float] = field(default_factory=dict)
    metrics_port: int = field(default_factory=lambda: free_port())
    metrics: dict[str, str] = field(default_factory=dict)

    @contextlib.contextmanager
    def step(self, name: str) -> Iterator[None]:
        """Time a step of the walk-through; the times are printed at the end (pytest -s)."""
        started = time.monotonic()
        try:
            yield
        finally:
            self.timings[name] = time.monotonic() - started

    def doc_command(self, prefix: str) -> str:
        [command] = [c for c in self.docs if c.startswith(prefix)]
        return command

    def run_doc(
        self, prefix: str, extra: Mapping[str, str] | None = None, timeout: float = 600
    ) -> subprocess.CompletedProcess[str]:
        """Run the walk-through's command starting with ``prefix`` as written, as the operator."""
        command = self.doc_command(prefix)
        result = self.operator.run(["bash", "-c", command], extra=extra, timeout=timeout)
        self.ran.append(command)
        assert result.returncode == 0, f"{command}\n{result.stdout}\n{result.stderr}\n" + (
            self.diagnosis()
        )
        return result

    def installed(self, relative: str) -> Path:
        return self.operator.home / relative

    def podman_logs(self) -> str:
        result = self.operator.run(["podman", "logs", "loopd"], timeout=60)
        return result.stdout + result.stderr

    def diagnosis(self) -> str:
        """What an operator would look at when something did not start."""
        status = self.operator.run(
            ["systemctl", "--user", "status", "--no-pager", "brokerd", "loopd"], timeout=60
        )
        brokerd_log = self.operator.root / "brokerd.log"
        return (
            f"--- systemctl --user status\n{status.stdout}{status.stderr}"
            f"--- podman logs loopd\n{self.podman_logs()[-4000:]}"
            f"--- brokerd\n{brokerd_log.read_text(errors='replace')[-4000:]}"
        )


def _until(condition: Callable[[], bool], what: str, timeout_s: float, walk: Walkthrough) -> None:
    """Wait for ``condition``, polling; fail with what the services say if time runs out."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"no {what} in {timeout_s} s\n{walk.diagnosis()}")
        time.sleep(0.5)


def _install(walk: Walkthrough) -> None:
    """``make install``, as its recipe says, from a copy of the checkout the operator can read,
    with the cache (wheelhouse, image archive, containers.conf) where the operator can read it."""
    operator = walk.operator
    checkout = operator.root / "checkout"
    checkout.mkdir()
    for folder in ("deploy", "scripts"):
        shutil.copytree(REPO_ROOT / folder, checkout / folder)
    cache = operator.root / "cache"
    (cache / "image" / "context").mkdir(parents=True)
    (cache / "podman").mkdir()
    with image_cache_unchanged():
        shutil.copytree(cache_dir() / "image/context/wheels", cache / "image/context/wheels")
        try:
            os.link(image_archive(), cache / "image" / "loopd-image.tar")
        except OSError:
            shutil.copy(image_archive(), cache / "image" / "loopd-image.tar")
    shutil.copy(containers_conf(), cache / "podman" / "containers.conf")
    recipe = subprocess.run(
        ["make", "--no-print-directory", "-s", "-n", "-o", "image", "install"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
        env={**minimal_env(Path.home()), "LOOPDEV_CACHE_DIR": str(cache)},
    ).stdout
    assert "deploy/install.sh" in recipe, recipe
    result = operator.run(["bash", "-c", recipe], cwd=checkout, timeout=900)
    assert result.returncode == 0, f"{recipe}\n{result.stdout}\n{result.stderr}"
    walk.ran.append(walk.doc_command("make install"))


def _configure_brokerd(walk: Walkthrough, mm_socket: Path) -> None:
    alice = walk.mm.state()["users"]["alice"]["id"]
    edit_toml(
        walk.installed(".config/brokerd/brokerd.toml"),
        {
            "inference_url": json.dumps(walk.llama.url),
            "mattermost_url": json.dumps(f"unix:{mm_socket}"),
            "chat_allowed_users": json.dumps([alice]),
            "metrics_addr": json.dumps(f"127.0.0.1:{walk.metrics_port}"),
        },
    )
    # loopd's socket where the example says (install.sh put the operator's home in it).
    uncomment_toml(walk.installed(".config/brokerd/brokerd.toml"), ["metrics_relay"])
    walk.run_doc("install -m 0600 /dev/stdin", {"BOT_TOKEN": walk.bot_token})
    # The test's stand-in for the journal: brokerd's output in a file, by a drop-in.
    log = walk.operator.root / "brokerd.log"
    log.touch()
    walk.operator.give(log)
    drop_in = walk.installed(".config/systemd/user/brokerd.service.d")
    drop_in.mkdir()
    (drop_in / "test-log.conf").write_text(
        f"[Service]\nStandardOutput=append:{log}\nStandardError=append:{log}\n"
    )
    for path in (drop_in, drop_in / "test-log.conf"):
        walk.operator.give(path)


def _configure_loopd(walk: Walkthrough) -> None:
    edit_toml(
        walk.installed(".config/loopd/loopd.toml"),
        {
            "model": json.dumps(devserver.PLAIN_MODEL),
            "slots": "[0]",
            # Short answers keep the test fast; the plain model does not think, so no cap
            # (a cap must leave the answer room below max_tokens, docs/deployment.md).
            "max_tokens": "48",
            "think_cap": "0",
        },
    )
    uncomment_toml(walk.installed(".config/loopd/loopd.toml"), ["metrics_addr"])
    edit_env(walk.installed(".config/loopd/loopd.env"), {"LOOPD_MM_ALLOWED_USERS": "alice"})


def _wait_serving(walk: Walkthrough) -> None:
    """Until the container's log (``podman logs``, the journal's stand-in) says it serves."""
    _until(lambda: SERVING in walk.podman_logs(), "serving loopd", STARTUP_S, walk)
    walk.loopd_logs.append(walk.podman_logs())


def _answers_after(walk: Walkthrough, count: int) -> None:
    _until(lambda: len(walk.mm.answers(walk.thread)) > count, "answer", TURN_S, walk)
    walk.answers.append(walk.mm.answers(walk.thread))


def _make_volumes(walk: Walkthrough) -> None:
    """The root step: the volumes' filesystems, mounted where the operator's manager (and the
    podman it starts) sees them, before any podman of the operator's runs."""
    operator = walk.operator
    assert operator.manager is not None
    script = REPO_ROOT / "deploy" / "volumes.sh"
    argv = ["nsenter", "-t", str(operator.manager.pid), "-m", "--", "bash", str(script)]
    argv += ["--user", operator.name, "--home", str(operator.home)]
    argv += ["--images", str(operator.root / "volumes"), "--fstab", str(operator.root / "fstab")]
    argv += ["--state-size", "128M", "--workspace-size", "512M"]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, f"{argv}\n{result.stdout}\n{result.stderr}"


def _walk(walk: Walkthrough, mm_socket: Path) -> None:
    operator = walk.operator
    with walk.step("volumes"):
        _make_volumes(walk)
    with walk.step("make install"):
        _install(walk)
    with walk.step("brokerd"):
        _configure_brokerd(walk, mm_socket)
        walk.run_doc("systemctl --user enable --now brokerd")
        # Type=notify: the start job has finished, so the sockets must be there now.
        socket_dir = operator.runtime_dir / "brokerd"
        walk.sockets_when_started = sorted(p.name for p in socket_dir.glob("*.sock"))
        shown = operator.check(
            ["systemctl", "--user", "show", "brokerd", "-p", "Type", "-p", "ActiveState"]
        )
        walk.brokerd_unit = dict(line.split("=", 1) for line in shown.splitlines() if line)
    with walk.step("record expectations"):
        _configure_loopd(walk)
        walk.run_doc("podman run --rm --network=none")
    with walk.step("loopd serving"):
        walk.run_doc("systemctl --user start loopd")
        _wait_serving(walk)
    with walk.step("first answer"):
        dm = walk.mm.direct_channel("alice")
        walk.thread = walk.mm.post_as("alice", dm, "Say hello in one short sentence.")["id"]
        _answers_after(walk, 0)
    with walk.step("probes"):
        walk.sessions = walk.run_doc("podman exec loopd loopd sessions").stdout
        walk.network = _probe_network(walk)
        walk.box = _probe_box(walk)
        walk.inspect = operator.check(["podman", "inspect", "loopd"])
        walk.metrics = _scrape_from_the_host(walk)
    with walk.step("systemd-analyze"):
        _check_units(walk)
    with walk.step("restart and answer"):
        before = len(walk.mm.answers(walk.thread))
        walk.run_doc("systemctl --user restart brokerd loopd")
        _wait_serving(walk)
        dm = walk.mm.direct_channel("alice")
        walk.mm.post_as("alice", dm, "Thanks. Say goodbye.", root_id=walk.thread)
        _answers_after(walk, before)
        walk.sessions_after_restart = walk.run_doc("podman exec loopd loopd sessions").stdout
        kept = [
            "podman",
            "exec",
            "loopd",
            "test",
            "-e",
            "/workspace/box-probe/written-by-a-command",
        ]
        walk.workspace_kept = operator.run(kept).returncode == 0


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _scrape_from_the_host(walk: Walkthrough) -> dict[str, str]:
    """brokerd's /metrics and loopd's, relayed from its socket in the folder the box mounts for
    it, read on the host at brokerd's loopback address (loopd itself has no network)."""
    pages = {}
    for name, path in (("brokerd", "/metrics"), ("loopd", "/loopd/metrics")):
        url = f"http://127.0.0.1:{walk.metrics_port}{path}"
        response = httpx.get(url, timeout=30)
        assert response.status_code == 200, f"{url}: {response.status_code} {response.text}"
        pages[name] = response.text
    return pages


def _probe_network(walk: Walkthrough) -> dict[str, Any]:
    """tests/e2e/inside.py, run in the box: TCP to the server, to [::1] and to an outside
    address, and a GET on each of brokerd's sockets."""
    address = walk.llama.url.removeprefix("http://")
    port = address.rpartition(":")[2]
    argv = ["podman", "exec", "-i", "loopd", "python3", "-", "--report", "/dev/stdout"]
    for target in (address, f"[::1]:{port}", OUTSIDE_ADDRESS):
        argv += ["--tcp", target]
    argv += ["--get", "infer=/run/loopd/infer.sock:/health"]
    argv += ["--get", "chat=/run/loopd/chat.sock:/api/v4/users/me"]
    argv += ["--get", "broker=/run/loopd/broker.sock:/v1/health"]
    inside = (REPO_ROOT / "tests" / "e2e" / "inside.py").read_text()
    report: dict[str, Any] = json.loads(walk.operator.check(argv, input=inside))
    return report


def _probe_box(walk: Walkthrough) -> dict[str, Any]:
    probe = (Path(__file__).parent / "box_probe.py").read_text()
    argv = ["podman", "exec", "-i", "loopd", "python3", "-"]
    report: dict[str, Any] = json.loads(walk.operator.check(argv, input=probe))
    return report


def _check_units(walk: Walkthrough) -> None:
    """systemd-analyze on the units as installed, with brokerd at the path its unit starts."""
    units = walk.installed(".config/systemd/user")
    walk.verify = walk.operator.run(
        [
            "systemd-analyze",
            "--user",
            "verify",
            str(units / "brokerd.service"),
            str(units / "loopd.service"),
        ]
    )
    walk.security = walk.operator.run(
        [
            "systemd-analyze",
            "--user",
            "security",
            "--offline=true",
            f"--threshold={SECURITY_THRESHOLD}",
            str(units / "brokerd.service"),
        ]
    )


@pytest.fixture(scope="module")
def walkthrough() -> Iterator[Walkthrough]:
    missing = missing_prerequisites()
    if missing:
        pytest.fail("the image test cannot run here; missing: " + "; ".join(missing))
    operator = Operator.make()
    root = operator.root
    bot_token = "image-bot-" + secrets.token_hex(16)
    try:
        llama = devserver.start(
            root / "llama",
            devserver.default_cache_dir(),
            port=devserver.free_port(),
            load=(devserver.PLAIN_MODEL,),
        )
    except devserver.DevServerError as exc:
        shutil.rmtree(root, ignore_errors=True)
        pytest.fail(f"the real llama-server is required and could not start: {exc}")
    mm_socket = root / "mm.sock"
    fake = [sys.executable, "-m", "loopd_dev.fakes.mattermost", "--uds", str(mm_socket)]
    mm_child = Child.start(
        "fake mattermost",
        [*fake, "--bot-token", bot_token],
        root / "mattermost.log",
        minimal_env(root, PYTHONPATH=str(REPO_ROOT)),
    )
    mm = FakeMattermost(mm_socket)
    docs = shell_commands(walkthrough_sections(DOCS.read_text()))
    walk = Walkthrough(operator, bot_token, llama, mm, docs)
    try:
        mm_child.wait_for('"uds"', 60)
        mm_socket.chmod(0o666)  # the operator's brokerd connects to it, as to Mattermost's HTTPS
        operator.start_manager()
        _walk(walk, mm_socket)
        print("image walk-through:", ", ".join(f"{k} {v:.0f} s" for k, v in walk.timings.items()))
        yield walk
    except ChildFailed as exc:
        pytest.fail(str(exc))
    finally:
        if operator.manager is not None:
            operator.run(["systemctl", "--user", "stop", "loopd", "brokerd"], timeout=120)
            operator.run(["podman", "system", "reset", "--force"], timeout=300)
        operator.stop_manager()
        mm.close()
        mm_child.stop()
        llama.stop()
        shutil.rmtree(root, ignore_errors=True)


# --- the tests ------------------------------------------------------------------------------------


def test_every_command_of_the_walkthrough_is_run_or_stood_in_for(walkthrough: Walkthrough) -> None:
    docs = set(walkthrough.docs)
    assert set(STOOD_IN) <= docs, f"stood in for, but not in the docs: {set(STOOD_IN) - docs}"
    untested = docs - set(walkthrough.ran) - set(STOOD_IN)
    assert not untested, f"commands in docs/deployment.md the image test does not run: {untested}"


def test_brokerd_is_started_only_once_its_sockets_exist(walkthrough: Walkthrough) -> None:
    assert walkthrough.brokerd_unit == {"Type": "notify", "ActiveState": "active"}
    assert walkthrough.sockets_when_started == ["broker.sock", "chat.sock", "infer.sock"]


def test_the_expectations_are_recorded_on_the_host_with_the_image(
    walkthrough: Walkthrough,
) -> None:
    recorded = walkthrough.installed(".config/loopd/expected/smollm2.json")
    assert recorded.stat().st_uid == walkthrough.operator.uid  # the box's user is the operator
    assert json.loads(recorded.read_text())["model"] == devserver.PLAIN_MODEL


def test_the_self_test_passes_in_the_box_and_a_direct_message_is_answered(
    walkthrough: Walkthrough,
) -> None:
    log = walkthrough.loopd_logs[0]
    # Against the expectations recorded on the host, not the ones in the package.
    passed = "self-test passed for smollm2 at unix:/run/loopd/infer.sock (expectations "
    assert passed + "/etc/loopd/expected/smollm2.json)" in log, log
    [answer] = walkthrough.answers[0]
    assert answer["message"].strip()
    assert f"mm:{walkthrough.thread}" in walkthrough.sessions


def test_both_daemons_metrics_are_scraped_on_the_host(walkthrough: Walkthrough) -> None:
    families = {
        name: {family.name for family in text_string_to_metric_families(page)}
        for name, page in walkthrough.metrics.items()
    }
    # The turn the walk-through answered is counted in the box and through brokerd's proxy.
    assert "loopd_turns" in families["loopd"], sorted(families["loopd"])
    assert "brokerd_requests" in families["brokerd"], sorted(families["brokerd"])
    # The socket's folder, as make install made it: the operator's alone.
    folder = walkthrough.installed(".local/state/loopd/metrics").stat()
    assert (folder.st_uid, oct(folder.st_mode & 0o777)) == (walkthrough.operator.uid, "0o700")


def test_the_box_reaches_nothing_but_brokerds_sockets(walkthrough: Walkthrough) -> None:
    report = walkthrough.network
    assert report["interfaces"] == ["lo"]
    assert len(report["tcp"]) == 3
    for attempt in report["tcp"]:
        assert not attempt["connected"], f"TCP reached {attempt['address']} from the box"
        assert attempt["errno"] in NO_ROUTE, attempt
    assert {probe["name"]: probe["status"] for probe in report["unix"]} == {
        "infer": 200,
        "chat": 200,  # brokerd added the bot token; the box sent none
        "broker": 200,
    }


def test_the_same_tcp_connect_succeeds_outside_the_box(walkthrough: Walkthrough) -> None:
    """The control: the probe's TCP check can succeed, so its failing inside means something."""
    report_path = walkthrough.operator.root / "outside-probe.json"
    argv = [sys.executable, "-m", "tests.e2e.inside", "--report", str(report_path)]
    argv += ["--tcp", walkthrough.llama.url.removeprefix("http://")]
    subprocess.run(argv, env=minimal_env(Path.home(), PYTHONPATH=str(REPO_ROOT)), check=True)
    [attempt] = json.loads(report_path.read_text())["tcp"]
    assert attempt["connected"], attempt


def test_the_box_holds_no_token(walkthrough: Walkthrough) -> None:
    token = walkthrough.bot_token
    assert walkthrough.answers[0], "a box that did nothing would prove nothing"
    assert token not in json.dumps(walkthrough.box["environ"])
    assert token not in walkthrough.inspect
    for log in walkthrough.loopd_logs:
        assert token not in log
    # Each volume binds the folder `volume` of its filesystem, mounted in the manager's namespace
    # only (so read there).
    for volume in ("state", "workspace"):
        folder = str(walkthrough.installed(f".local/share/loopd/{volume}/volume"))
        found = walkthrough.operator.run(["grep", "-rlF", token, folder])
        assert (found.returncode, found.stdout) == (1, ""), f"{volume}: {found}"  # 1: no match
        if volume == "state":
            assert walkthrough.operator.run(["test", "-e", f"{folder}/loopd.db"]).returncode == 0
    # The token is where the operator put it; brokerd used it and kept it out of its log.
    assert token in walkthrough.installed(".config/brokerd/bot-token").read_text()
    assert token not in (walkthrough.operator.root / "brokerd.log").read_text()


def test_the_boxs_volumes_are_the_filesystems_of_the_sizes_given(walkthrough: Walkthrough) -> None:
    sizes = {}
    for path in ("/var/lib/loopd", "/workspace"):
        df = ["podman", "exec", "loopd", "df", "-B1", "--output=size,fstype", path]
        size, fstype = walkthrough.operator.check(df).splitlines()[-1].split()
        assert fstype == "ext4", path
        sizes[path] = int(size)
    # 128M and 512M (_make_volumes), less ext4's own tables and journal.
    assert 100 * 1024**2 <= sizes["/var/lib/loopd"] <= 128 * 1024**2, sizes
    assert 450 * 1024**2 <= sizes["/workspace"] <= 512 * 1024**2, sizes


def test_run_command_is_sandboxed_by_bubblewrap_in_the_box(walkthrough: Walkthrough) -> None:
    sandbox = walkthrough.box["sandbox"]
    assert sandbox["isolated"], f"bubblewrap does not work in the box: {sandbox['reason']}"
    assert sandbox["privileges_kept"] is None, sandbox["privileges_kept"]
    assert sandbox["exit_code"] == 0, sandbox["output"]
    seen = dict(sandbox["seen"])
    shell_pid = int(seen.pop("shell_pid"))
    assert walkthrough.box["metrics_socket"]  # loopd's metrics socket, which commands never see
    assert seen == {
        "state": "hidden",
        "sockets": "hidden",
        "metrics": "hidden",
        "config": "hidden",
        "workspace": "writable",
        "user_namespace": "refused",
    }
    assert shell_pid < 10  # its own PID namespace
    assert "NOT sandboxed" not in walkthrough.loopd_logs[0]


def test_brokerds_confined_catalogue_tools_run_under_its_unit(walkthrough: Walkthrough) -> None:
    """host_uptime runs in bubblewrap inside brokerd.service's sandbox, called from the box."""
    call = walkthrough.box["broker_call"]
    assert call["status"] == "ok", call
    assert "load average" in call["result"], call


def test_the_box_is_what_the_quadlet_says(walkthrough: Walkthrough) -> None:
    box = walkthrough.box
    # UserNS=keep-id:uid=1000: the image's user, which is the operator on the host (the
    # expectations it recorded belong to the operator).
    assert box["uid"] == 1000
    assert box["uid_map"] != ["0", "0", "4294967295"]  # inside a user namespace
    assert box["cap_eff"] == "0000000000000000"  # DropCapability=all
    assert box["no_new_privs"] == "1"  # NoNewPrivileges=true
    assert box["root_read_only"]  # ReadOnly=true


def test_the_units_verify_clean_and_brokerd_is_sandboxed(walkthrough: Walkthrough) -> None:
    verify, security = walkthrough.verify, walkthrough.security
    assert verify is not None
    assert security is not None
    assert (verify.returncode, verify.stdout + verify.stderr) == (0, "")
    assert security.returncode == 0, security.stdout + security.stderr
    container, volumes = quadlet.load_container(REPO_ROOT / "deploy" / "loopd.container")
    podman = shutil.which("podman")
    assert podman is not None
    cgroups = "split" if Path("/sys/fs/cgroup/cgroup.controllers").exists() else "enabled"
    installed = walkthrough.installed(".config/systemd/user/loopd.service").read_text()
    assert installed == quadlet.service_unit(container, volumes, podman, cgroups)


def test_sessions_and_workspaces_survive_a_restart(walkthrough: Walkthrough) -> None:
    first, second = walkthrough.answers
    assert len(second) == len(first) + 1
    assert SERVING in walkthrough.loopd_logs[1]
    assert f"mm:{walkthrough.thread}" in walkthrough.sessions_after_restart
    assert walkthrough.workspace_kept
