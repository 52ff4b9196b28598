"""Acceptance: loopd in a network namespace with no interfaces up, reaching out only through
brokerd's Unix sockets, with brokerd in front of the real llama-server on loopback.

One sandboxed run serves every test here: ``unshare -n`` starts the probe (``tests.e2e.inside``),
which records what it can reach and then execs ``loopd chat`` in the same namespace, with one
line on stdin. The bot token lives only in brokerd's token file and the fake Mattermost.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from loopd_dev import devserver
from tests.e2e.e2e_support import REPO_ROOT, Brokerd, files_containing, minimal_env

pytestmark = pytest.mark.real_server

# Not routed anywhere from here; inside the namespace it must fail at once, not time out.
OUTSIDE_ADDRESS = "10.255.255.1:80"
CHAT_TIMEOUT_S = 120
# The errors a connect may end in when there is no network at all.
NO_ROUTE = {"ENETUNREACH", "ECONNREFUSED", "EHOSTUNREACH", "EADDRNOTAVAIL"}


@dataclass(frozen=True)
class SandboxRun:
    result: subprocess.CompletedProcess[str]
    env: dict[str, str]
    state_dir: Path
    report: dict[str, Any]


def _probe_argv(report: Path, llama_address: str, brokerd: Brokerd) -> list[str]:
    argv = [sys.executable, "-m", "tests.e2e.inside", "--report", str(report)]
    for address in (llama_address, f"[::1]:{llama_address.rpartition(':')[2]}", OUTSIDE_ADDRESS):
        argv += ["--tcp", address]
    argv += ["--get", f"infer={brokerd.socket('infer')}:/health"]
    argv += ["--get", f"chat={brokerd.socket('chat')}:/api/v4/users/me"]
    argv += ["--get", f"broker={brokerd.socket('broker')}:/v1/health"]
    return argv


def _llama_address(server: devserver.RunningServer) -> str:
    return server.url.removeprefix("http://")


@pytest.fixture(scope="module")
def sandbox_run(e2e_dir: Path, brokerd: Brokerd, llama_tcp: devserver.RunningServer) -> SandboxRun:
    unshare = shutil.which("unshare")
    if unshare is None or subprocess.run([unshare, "-n", "true"], check=False).returncode:
        pytest.fail("`unshare -n` is required (util-linux, run as root) and does not work here")
    box = e2e_dir / "box"
    state_dir = box / "state"
    env = minimal_env(
        box / "home",
        PYTHONPATH=str(REPO_ROOT),  # for the probe; loopd itself is installed in the venv
        LOOPD_INFER_URL=f"unix:{brokerd.socket('infer')}",
        LOOPD_MODEL=devserver.PLAIN_MODEL,
        LOOPD_BROKER_URL=f"unix:{brokerd.socket('broker')}",
        LOOPD_STATE_DIR=str(state_dir),
        LOOPD_MAX_TOKENS="48",
        LOOPD_THINK_CAP="0",
        LOOPD_LOG_FORMAT="json",
    )
    (box / "home").mkdir(parents=True)
    report = box / "probe.json"
    loopd = str(Path(sys.executable).with_name("loopd"))
    argv = [unshare, "-n", *_probe_argv(report, _llama_address(llama_tcp), brokerd)]
    argv += ["--", loopd, "chat", "--session", "e2e"]
    result = subprocess.run(
        argv,
        input="Say hello in one short sentence.\n",
        capture_output=True,
        text=True,
        env=env,
        cwd=box,
        timeout=CHAT_TIMEOUT_S,
        check=False,
    )
    assert report.exists(), f"the probe did not run:\n{result.stderr}"
    return SandboxRun(result, env, state_dir, json.loads(report.read_text()))


def test_a_turn_completes_through_brokerd_from_inside_the_namespace(
    sandbox_run: SandboxRun, brokerd: Brokerd
) -> None:
    result = sandbox_run.result
    assert result.returncode == 0, f"loopd chat failed:\n{result.stderr}"
    assert result.stdout.strip(), "no answer printed"
    assert result.stdout.strip() != "(no answer)"
    logged = [json.loads(line) for line in result.stderr.splitlines() if line.startswith("{")]
    requests = [entry for entry in logged if entry.get("msg") == "model request"]
    assert [entry["outcome"] for entry in requests] == ["complete"], result.stderr
    # The turn went through brokerd's inference proxy (there is no other way out of the box).
    # loopd closes its connection once it has read [DONE], which can be before brokerd relays
    # the chunked body's last (empty) chunk: brokerd then logs client_gone for a stream that
    # was delivered whole.
    relayed = brokerd.child.log()
    assert (
        '"POST /v1/chat/completions -> 200 complete' in relayed
        or '"POST /v1/chat/completions -> 200 client_gone' in relayed
    ), relayed


def test_the_namespace_has_no_network_but_the_sockets_work(
    sandbox_run: SandboxRun, llama_tcp: devserver.RunningServer
) -> None:
    report = sandbox_run.report
    assert report["interfaces"] == ["lo"], "the namespace should hold only its own loopback"
    for attempt in report["tcp"]:
        assert not attempt["connected"], f"TCP reached {attempt['address']} from the box"
        assert attempt["errno"] in NO_ROUTE, attempt
    assert {probe["name"]: probe["status"] for probe in report["unix"]} == {
        "infer": 200,
        "chat": 200,  # brokerd added the bot token; the box sent none
        "broker": 200,
    }


def test_the_same_tcp_connect_succeeds_outside_the_namespace(
    e2e_dir: Path, brokerd: Brokerd, llama_tcp: devserver.RunningServer
) -> None:
    """The control: the probe's TCP check can fail, so its failing inside means something."""
    report_path = e2e_dir / "outside-probe.json"
    argv = [sys.executable, "-m", "tests.e2e.inside", "--report", str(report_path)]
    argv += ["--tcp", _llama_address(llama_tcp)]
    subprocess.run(argv, env=minimal_env(e2e_dir, PYTHONPATH=str(REPO_ROOT)), check=True)
    [attempt] = json.loads(report_path.read_text())["tcp"]
    assert attempt["connected"], attempt


def test_the_bot_token_never_enters_the_box(sandbox_run: SandboxRun, bot_token: str) -> None:
    assert sandbox_run.result.returncode == 0  # a run that did nothing would prove nothing
    needle = bot_token.encode()
    assert not [name for name, value in sandbox_run.env.items() if bot_token in value]
    assert files_containing(sandbox_run.state_dir, needle) == []
    assert sandbox_run.state_dir.joinpath("loopd.db").exists()
    assert bot_token not in sandbox_run.result.stdout
    assert bot_token not in sandbox_run.result.stderr
    assert bot_token not in json.dumps(sandbox_run.report)


def test_brokerd_keeps_the_token_out_of_its_own_log(
    sandbox_run: SandboxRun, brokerd: Brokerd, bot_token: str
) -> None:
    log = brokerd.child.log()
    assert "GET /api/v4/users/me -> 200 complete" in log  # the chat proxy did use the token
    assert bot_token not in log
